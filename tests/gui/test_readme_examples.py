"""The README's GUI claims, driven through the window: its wrapped device-map example imports
into the model of `workbench make-demo demo --params 10M`, and Copy as code says that
transformers needs `accelerate` to load along a device map."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.gui import map_io

pytestmark = [pytest.mark.gui, pytest.mark.slow]  # makes a 10M demo, opens it

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def test_the_wrapped_map_example_imports_into_the_make_demo_model(
    main_window, open_in_window, tmp_path, monkeypatch
) -> None:
    section = README[README.index("## Device-map files") :]
    wrapped = re.findall(r"```json\n(.*?)```", section, flags=re.DOTALL)[1]
    assert "make-demo demo --params 10M" in section
    monkeypatch.chdir(tmp_path)
    assert main(["make-demo", "demo", "--params", "10M"]) == 0  # the tour's first command
    example = tmp_path / "wrapped.json"
    example.write_text(wrapped, encoding="utf-8")
    window = main_window
    open_in_window(window, tmp_path / "demo")
    dialog = map_io.import_device_map(window, example)
    assert dialog is not None
    assert dialog.problems == [], dialog.problems
    dialog.accept()
    assert window.session.device_map == {"model": "cpu", "lm_head": "disk"}

    snippet = map_io.copy_as_code(window)
    assert "needs accelerate: python3 -m pip install accelerate" in snippet
    assert "`accelerate`" in README and "Copy as code" in README
