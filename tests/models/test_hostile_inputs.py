"""Hostile configs and hardware profiles: a named error (or a skipped profile), never a crash."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from workbench.models import hardware
from workbench.models.errors import ModelSourceError, ProfileError
from workbench.models.intake import open_model

TINY = json.loads(
    (Path(__file__).parents[2] / "resources/configs/tiny-llama-demo.json").read_text()
)


def _config(tmp_path: Path, **overrides: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY, **overrides}))
    return path


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": 0}, r"'hidden_size' must be a whole number of at least 1, got 0"),
        ({"num_hidden_layers": -3}, r"'num_hidden_layers' must be .* at least 1, got -3"),
        ({"vocab_size": True}, r"'vocab_size'.* got True|'vocab_size' expected int, got bool"),
        ({"num_attention_heads": 4.5}, r"'num_attention_heads'.*4\.5"),
        ({"num_hidden_layers": 10**12}, r"would build about 16,000,000,000,008 modules"),
        ({"hidden_size": 10**9, "head_dim": 64}, r"would hold about .* parameters"),
    ],
    ids=["hidden-0", "layers-negative", "vocab-bool", "heads-float", "layers-1e12", "params-huge"],
)
def test_structural_fields_are_checked_before_building(
    tmp_path: Path, overrides: dict, message: str
) -> None:
    path = _config(tmp_path, **overrides)
    with pytest.raises(ModelSourceError, match=message) as caught:
        open_model(path)
    assert str(caught.value).startswith(str(path))


def test_a_deeply_nested_config_is_a_named_error(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ModelSourceError, match=r"config\.json: nested more than 64 levels deep"):
        open_model(path)


def test_an_oversized_config_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    with path.open("wb") as handle:  # sparse: 17 MiB of size, no bytes written
        handle.truncate(17 * 2**20)
    with pytest.raises(ModelSourceError, match=r"too big: 17825792 bytes"):
        open_model(path)


def _user_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    folder = hardware.user_profiles_dir()
    folder.mkdir(parents=True)
    return folder


def _profile(memory: object) -> str:
    return json.dumps({"name": "mine", "devices": [{"device": "cpu", "memory": memory}]})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"devices": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested more than 64 levels"),
        (_profile(1e400), "above the limit of 1 EiB"),  # json reads 1e400 as inf
        (_profile("9" * 400 + "GB"), "above the limit of 1 EiB"),
        (_profile(float("nan")), r"not a number \(NaN\)"),
        (_profile("\u0661GB"), "not a number with a known unit"),
        ('{"name": "x", "devices": [{"device": "\u00b2", "memory": 1}]}', "is not a device"),
        ('{"devices": [' + "1" * 5000 + "]}", "not usable JSON"),
    ],
    ids=["deep", "1e400", "400-digits", "nan", "arabic-digit", "superscript", "long-int"],
)
def test_bad_user_profiles_are_skipped_and_named_on_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog, text: str, message: str
) -> None:
    folder = _user_profiles(tmp_path, monkeypatch)
    path = folder / "bad.json"
    path.write_text(text, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger=hardware.__name__):
        names = [profile.name for profile in hardware.list_profiles()]
    assert "bad" not in names and names  # the bundled ones are still there
    assert any(re.search(message, record.getMessage()) for record in caplog.records)
    with pytest.raises(ProfileError, match=message):
        hardware.load_profile(path)


def test_a_dangling_link_in_the_profile_folder_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _user_profiles(tmp_path, monkeypatch)
    (folder / "gone.json").symlink_to(tmp_path / "nowhere.json")
    (folder / "dir.json").mkdir()  # a folder named like a profile
    assert hardware.list_profiles()  # neither raises FileNotFoundError nor IsADirectoryError


def test_a_profile_saved_with_a_bom_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _user_profiles(tmp_path, monkeypatch)
    path = folder / "notepad.json"
    path.write_bytes(b"\xef\xbb\xbf" + _profile("8GiB").encode())  # Notepad's UTF-8 BOM
    assert hardware.load_profile(path).budgets()["cpu"] == 8 * 2**30
