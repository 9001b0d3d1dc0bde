"""One object per opened model: nothing derived from one model is shown for the next (issue 14).

Opening another model replaces the session's ``ModelContext`` whole: the planner's table and
"Why" list, the reserve in the lanes and the edited budgets go with it; only the hardware
profile carries over. Plan (Ctrl+P) plans and applies in one undo step, no two actions share a
key, and a lane's red border goes as soon as it fits.
"""

from __future__ import annotations

from typing import Any

import pytest
from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QAction, QKeySequence, QShortcut

from workbench.gui.tree_model import modules_mime_data
from workbench.resources import resource_path
from workbench.runtime.formatting import format_nbytes

pytestmark = pytest.mark.gui

GIB = 1024**3


def _compare(qtbot: Any, panel: Any) -> None:
    with qtbot.waitSignal(panel.comparison_ready, timeout=60_000):
        panel.compare_button.click()
    qtbot.waitUntil(lambda: not panel.thread.isRunning(), timeout=5000)


@pytest.mark.slow  # opens two models with transformers on a worker thread
def test_opening_another_model_replaces_everything_derived_from_the_first(
    qtbot, main_window, open_in_window, whatif_config, demo_dir, test_profile
) -> None:
    window = main_window
    panel = window.planner_panel
    open_in_window(window, whatif_config)
    first = window.session.context
    # the user plans the first model with a 5 GiB reserve and edits a budget
    panel.reserve_by_bytes.setChecked(True)
    panel.reserve_gib.setValue(5.0)
    _compare(qtbot, panel)
    panel.apply_buttons["auto"].click()
    assert window.session.reserve == 5 * GIB
    assert "5 GiB reserve" in window.lanes.lane(0).figures_label.text()
    assert panel.trace_view.topLevelItemCount() > 0 and panel.table.columnCount() == 4
    window.budget_editor.spin_boxes["cpu"].setValue(3.0)
    assert panel.budget_editor.spin_boxes["cpu"].value() == 3.0  # one budget, both editors

    open_in_window(window, demo_dir)  # another model
    context = window.session.context
    assert context is not first and context.generation == first.generation + 1
    assert context.comparison is None and context.loaded is None
    assert panel.table.columnCount() == 0 and panel.apply_buttons == {}
    assert panel.trace_view.topLevelItemCount() == 0  # the "Why" list kept no old rows
    # the reserve is the planner's estimate for this model, not the old model's 5 GiB
    assert panel.reserve_by_shape.isChecked()
    reserve = panel.reserve_bytes()
    assert 0 < reserve < 5 * GIB and window.session.reserve == reserve
    figures = window.lanes.lane(0).figures_label.text()
    assert f"{format_nbytes(reserve)} reserve" in figures and "5 GiB" not in figures
    # budgets: the profile's (it carries over, explicitly), not the edited 3 GiB
    assert window.session.budgets == test_profile.budgets()
    assert panel.budget_editor.budgets() == window.budget_editor.budgets() == test_profile.budgets()
    assert window.hardware_profile() is not None
    assert window.hardware_profile().name == test_profile.name
    assert not window.session.dirty


def test_a_comparison_for_a_model_that_was_replaced_is_dropped(
    qtbot, tiny_window, tiny_opened
) -> None:
    window = tiny_window
    panel = window.planner_panel
    thread = panel.compare()
    assert thread is not None
    window.set_opened("tiny-lm-again", tiny_opened.with_dtype("float16"))  # before it finishes
    thread.wait()
    qtbot.waitUntil(panel.compare_button.isEnabled, timeout=5000)
    assert panel.candidates == [] and panel.table.columnCount() == 0
    assert panel.trace_view.topLevelItemCount() == 0


def test_budgets_edited_in_the_planner_panel_are_the_sessions(tiny_window) -> None:
    window = tiny_window
    panel = window.planner_panel
    panel.budget_editor.spin_boxes["cpu"].setValue(7.0)  # the user edits the planner's editor
    assert window.session.budgets["cpu"] == 7 * GIB
    assert window.budget_editor.spin_boxes["cpu"].value() == 7.0  # the Budgets dock agrees
    assert window.undo_stack.undoText() == "Edit budgets"
    assert panel.request().budgets == window.session.budgets
    window.undo_stack.undo()
    assert (
        panel.budget_editor.spin_boxes["cpu"].value()
        == window.budget_editor.spin_boxes["cpu"].value()
        != 7.0
    )


def test_ctrl_p_plans_with_the_current_strategy_and_applies_one_undo_step(
    qtbot, tiny_window
) -> None:
    window = tiny_window
    panel = window.planner_panel
    panel.reserve_by_bytes.setChecked(True)
    panel.reserve_gib.setValue(0)
    panel.strategy_combo.setCurrentText("sequential")
    before = dict(window.session.device_map)
    assert before == {"": "cpu"}
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5000)
    with qtbot.waitSignal(panel.comparison_ready, timeout=60_000):
        qtbot.keyClick(window, Qt.Key.Key_P, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: window.session.device_map != before, timeout=5000)
    planned = panel.candidate("sequential").plan.device_map
    assert window.session.device_map == planned
    assert window.undo_stack.undoText() == "Apply sequential plan"
    assert panel.table.columnCount() == 1  # the plan and its "Why" list stay on view
    assert panel.trace_view.topLevelItemCount() > 0
    window.undo_stack.undo()  # one step takes the whole plan back
    assert window.session.device_map == before
    # the comparison is still there: Compare plans every checked strategy
    _compare(qtbot, panel)
    assert panel.table.columnCount() == 4


def _shortcuts(window: Any) -> dict[str, list[str]]:
    owners: dict[str, list[str]] = {}
    for action in window.findChildren(QAction):
        for sequence in action.shortcuts():
            key = sequence.toString(QKeySequence.SequenceFormat.PortableText)
            owners.setdefault(key, []).append(action.text() or action.objectName())
    for shortcut in window.findChildren(QShortcut):
        key = shortcut.key().toString(QKeySequence.SequenceFormat.PortableText)
        if key:
            owners.setdefault(key, []).append(f"QShortcut {shortcut.objectName()}")
    return owners


def test_no_two_actions_share_a_shortcut(main_window) -> None:
    shared = {key: names for key, names in _shortcuts(main_window).items() if len(names) > 1}
    assert not shared, f"shortcuts bound twice (Qt calls them ambiguous): {shared}"
    assert "Ctrl+Shift+Z" in _shortcuts(main_window)


def test_ctrl_shift_z_redoes(qtbot, tiny_window) -> None:
    window = tiny_window
    window.lanes.lane(0).dropMimeData(modules_mime_data(["norm"]))
    moved = dict(window.session.device_map)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5000)
    qtbot.keyClick(window, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert window.session.device_map == {"": "cpu"}
    shift_ctrl = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    qtbot.keyClick(window, Qt.Key.Key_Z, shift_ctrl)
    assert window.session.device_map == moved


class _PaintedRects(QObject):
    """Records the rectangles a widget repaints."""

    def __init__(self) -> None:
        super().__init__()
        self.rects: list[Any] = []

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Paint:
            self.rects.append(event.rect())
        return False


def test_the_red_border_goes_as_soon_as_the_lane_fits(qtbot, tiny_window) -> None:
    window = tiny_window
    window.setStyleSheet(resource_path("styles", "workbench.qss").read_text(encoding="utf-8"))
    window.lanes.lane(0).dropMimeData(modules_mime_data(["layers"]))  # 2304 B on cuda:0
    budgets = dict(window.session.budgets)
    budgets[0] = 2000
    window.budget_editor.budgets_edited.emit(budgets)
    lane = window.lanes.lane(0)
    assert lane.property("overBudget") is True
    qtbot.waitExposed(lane)
    painted = _PaintedRects()
    lane.installEventFilter(painted)
    window.undo_stack.undo()  # the lane fits again: its border (the frame's edge) is repainted
    assert lane.property("overBudget") is False
    corner = lane.rect().topLeft()
    qtbot.waitUntil(lambda: any(rect.contains(corner) for rect in painted.rects), timeout=5000)
    lane.removeEventFilter(painted)
