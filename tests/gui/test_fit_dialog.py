"""Tools > What fits where: the table of every profile by context, and one double-click that
applies a profile and its plan as one undo step (issue 21)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from workbench.gui.fit_dialog import FitDialog
from workbench.models.hardware import load_profile
from workbench.runtime.fit_table import FULL_GPU, NO_FIT

pytestmark = pytest.mark.gui


@pytest.fixture
def user_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user profile too small for anything, beside the bundled ones."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    folder = tmp_path / "model-memory-workbench" / "hardware"
    folder.mkdir(parents=True)
    data = {
        "description": "a 64 KiB box (tests)",
        "devices": [{"device": "cpu", "memory": "64KiB"}, {"device": "disk", "memory": "64KiB"}],
    }
    (folder / "tiny-box.json").write_text(json.dumps(data))
    return folder


@pytest.fixture
def fit_dialog(
    main_window: Any, open_in_window: Any, whatif_config: Path, user_profiles: Path
) -> FitDialog:
    open_in_window(main_window, whatif_config)
    main_window.action_set["fit_table"].trigger()
    (dialog,) = main_window.findChildren(FitDialog)
    dialog.wait_until_computed()
    assert dialog.table is not None, dialog.status_label.text()
    return dialog


def _row(dialog: FitDialog, name: str) -> int:
    return [p.name for p in dialog.table.profiles].index(name)


def test_the_table_lists_every_profile_by_the_models_contexts(fit_dialog: FitDialog) -> None:
    from workbench.gui.window_hardware import UNMEASURED_HOST

    assert UNMEASURED_HOST not in fit_dialog.status_label.text()  # no profile of this machine
    table, grid = fit_dialog.table, fit_dialog.grid
    # the tiny demo supports 512 positions: no 4k column, only its maximum
    assert table.contexts == (512,)
    names = [p.name for p in table.profiles]
    assert {"h200-141gb", "rtx4090-64gb", "cpu-laptop-16gb", "tiny-box"} <= set(names)
    assert grid.rowCount() == len(names) and grid.columnCount() == 1
    assert grid.horizontalHeaderItem(0).text() == "512 context"
    h200 = grid.item(_row(fit_dialog, "h200-141gb"), 0)
    assert h200.text().startswith(f"{FULL_GPU}\n") and "tok/s · TTFT" in h200.text()
    assert "on cuda:0 need" in h200.toolTip()  # the memory model's reason
    tiny = grid.item(_row(fit_dialog, "tiny-box"), 0)
    assert tiny.text() == NO_FIT and "budget" in tiny.toolTip()


def test_double_click_applies_profile_and_plan_and_undo_restores(
    fit_dialog: FitDialog, main_window: Any
) -> None:
    session = main_window.session
    before = (session.profile.name, dict(session.budgets), dict(session.device_map))
    row = _row(fit_dialog, "h200-141gb")
    cell = fit_dialog.cell_at(row, 0)
    grid = fit_dialog.grid
    grid.scrollToItem(grid.item(row, 0))
    center = grid.visualItemRect(grid.item(row, 0)).center()
    QTest.mouseClick(grid.viewport(), Qt.MouseButton.LeftButton, pos=center)
    assert fit_dialog.apply_button.isEnabled()
    QTest.mouseDClick(grid.viewport(), Qt.MouseButton.LeftButton, pos=center)
    h200 = load_profile("h200-141gb")
    assert session.profile.name == "h200-141gb"
    assert session.budgets == h200.budgets() and session.device_map == cell.device_map
    assert main_window.hardware.profile.name == "h200-141gb"  # the selector follows
    assert main_window.undo_stack.undoText() == "Use h200-141gb at 512 (what fits where)"
    main_window.undo_stack.undo()  # one step takes back profile, budgets and map
    assert (session.profile.name, dict(session.budgets), dict(session.device_map)) == before
    assert main_window.hardware.profile.name == before[0]


def test_a_cell_that_does_not_fit_cannot_be_applied(
    fit_dialog: FitDialog, main_window: Any
) -> None:
    row = _row(fit_dialog, "tiny-box")
    fit_dialog.grid.setCurrentCell(row, 0)
    assert not fit_dialog.apply_button.isEnabled()
    count = main_window.undo_stack.count()
    assert not fit_dialog.apply_cell(row, 0)
    assert main_window.undo_stack.count() == count
    assert "tiny-box" in main_window.statusBar().currentMessage()


def test_an_encoder_is_listed_by_its_forward_time(
    main_window: Any, open_in_window: Any, user_profiles: Path
) -> None:
    from workbench.resources import resource_path

    open_in_window(main_window, resource_path("configs", "bert-base-uncased.json"))
    main_window.action_set["fit_table"].trigger()
    (dialog,) = main_window.findChildren(FitDialog)
    dialog.wait_until_computed()
    assert dialog.table is not None, dialog.status_label.text()
    status = dialog.status_label.text()
    assert "1 context length," in status and "generates no tokens" in status
    assert "TTFT" not in status
    h200 = dialog.grid.item(_row(dialog, "h200-141gb"), 0)
    assert h200.text().startswith(f"{FULL_GPU}\nforward ") and "tok/s" not in h200.text()
    assert "over 512 input tokens; the model generates no tokens" in h200.toolTip()
    tiny = dialog.table.cells[_row(dialog, "tiny-box")]  # one context: a row's only cell
    assert tiny.status == NO_FIT and not tiny.generates


def test_this_machine_is_the_first_row_and_applies_like_the_others(
    main_window: Any, open_in_window: Any, whatif_config: Path, user_profiles: Path
) -> None:
    from workbench.models.hardware import DETECTED_NAME, detect_hardware

    here = detect_hardware(measure_links=False)
    main_window.hardware_selector.add_profile(here)  # as the window lists it at start
    open_in_window(main_window, whatif_config)
    main_window.action_set["fit_table"].trigger()
    dialog = main_window.findChildren(FitDialog)[-1]
    dialog.wait_until_computed()
    assert dialog.table is not None, dialog.status_label.text()
    assert dialog.table.profiles[0] is here  # the window's own, with its measured figures
    from workbench.gui.window_hardware import UNMEASURED_HOST
    from workbench.models.hardware import host_probes_applied

    # measured or not, the status says which: a fresh install predicts from typical costs
    assert (UNMEASURED_HOST in dialog.status_label.text()) != host_probes_applied(here)
    assert dialog.grid.verticalHeaderItem(0).text() == "This machine"
    assert dialog.grid.item(0, 0).toolTip().startswith("This machine at 512 context: ")
    assert "tiny-box" in [p.name for p in dialog.table.profiles]  # and every saved profile
    assert dialog.apply_cell(0, 0)
    assert main_window.session.profile.name == DETECTED_NAME
    assert main_window.session.device_map == dialog.cell_at(0, 0).device_map
    assert main_window.undo_stack.undoText() == "Use this machine at 512 (what fits where)"
