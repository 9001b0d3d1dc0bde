"""The bundled hardware profiles describe the hardware, not where it came from (issue 14)."""

from __future__ import annotations

import json

import pytest

from workbench.models.hardware import bundled_profiles_dir, load_profile

PROFILE_FILES = sorted(bundled_profiles_dir().glob("*.json"))


def test_there_are_bundled_profiles() -> None:
    assert len(PROFILE_FILES) >= 4


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_a_bundled_profile_description_names_the_hardware(path) -> None:
    description = json.loads(path.read_text())["description"]
    lowered = description.lower()
    for story in ("borrowed", "test machine", "our ", "my "):
        assert story not in lowered, description
    profile = load_profile(path)
    # what the user compares profiles by: the accelerator (or "CPU-only"), RAM and disk
    assert "RAM" in description and ("GPU" in description or "CPU-only" in description)
    assert profile.description == description
