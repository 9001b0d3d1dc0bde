"""The planner panel: strategies side by side, traces in tooltips, apply as one undo step."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from user_input import compare_strategies

from workbench.runtime.strategy_compare import run_comparison

pytestmark = pytest.mark.gui

GIB = 1024**3


def test_compare_fills_the_table_and_apply_is_one_undo_step(qtbot, tiny_window) -> None:
    window = tiny_window
    panel = window.planner_panel
    # 2848 B in total; blocks of 576 B are no-split; GPU 0 holds 1300 B, GPU 1 1300 B
    budgets = {0: 1300, 1: 1300, "cpu": 10_000, "disk": 10**9}
    candidates = compare_strategies(qtbot, window, budgets)
    assert [c.strategy for c in candidates] == ["auto", "balanced", "balanced_low_0", "sequential"]
    assert all(c.plan is not None for c in candidates), [c.error for c in candidates]
    assert panel.table.columnCount() == 4
    rows = [panel.table.verticalHeaderItem(r).text() for r in range(panel.table.rowCount())]
    assert rows[-3:] == ["tokens/s", "TTFT", "status"]
    assert "cuda:0" in rows
    sequential = panel.candidate("sequential")
    for device, nbytes in sequential.plan.per_device_bytes.items():
        assert nbytes <= budgets[device]
    # the trace explains each placement in a tooltip
    panel.show_trace("sequential")
    first = panel.trace_view.topLevelItem(0)
    assert first is not None and first.toolTip(0) == first.text(3) and first.text(3)
    before = dict(window.session.device_map)
    panel.table.setCurrentCell(0, 0)  # auto's trace shows
    assert panel.apply("sequential")
    # the applied plan's column and trace show, not the one looked at before
    assert panel.table.currentColumn() == 3
    shown = [
        panel.trace_view.topLevelItem(i).text(3)
        for i in range(panel.trace_view.topLevelItemCount())
    ]
    assert shown == [p.reason for p in sequential.plan.trace][: len(shown)] and shown
    assert window.session.device_map == sequential.plan.device_map
    assert window.session.budgets == budgets
    # the budget edit, then the plan: each one undo step
    assert window.undo_stack.count() == 2
    assert window.undo_stack.undoText() == "Apply sequential plan"
    tooltip = window.tree_model.index_of("layers.0.mlp").data(Qt.ItemDataRole.ToolTipRole)
    assert "<i>planner:</i> " in tooltip
    window.undo_stack.undo()
    assert window.session.device_map == before


def test_a_strategy_that_cannot_fit_shows_its_error_and_cannot_apply(qtbot, tiny_window) -> None:
    window = tiny_window
    panel = window.planner_panel
    for strategy, check in panel.strategy_checks.items():
        check.setChecked(strategy == "sequential")
    candidates = compare_strategies(qtbot, window, {0: 100, 1: 100, "cpu": 100, "disk": 200})
    assert len(candidates) == 1 and candidates[0].plan is None and candidates[0].error
    assert not panel.apply_buttons["sequential"].isEnabled()
    assert not panel.apply("sequential")
    assert window.undo_stack.undoText() == "Edit budgets"  # nothing applied after the edit


def test_run_comparison_predicts_speed_for_each_plan(tiny_window) -> None:
    request = tiny_window.planner_panel.request()
    candidates = run_comparison(request)
    fitted = [c for c in candidates if c.plan is not None]
    assert fitted and all(
        c.prediction is not None and c.prediction.tokens_per_s > 0 for c in fitted
    )


def _planner_devices(window) -> list:
    return list(window.planner_panel.budget_editor.budgets())


def test_planner_budgets_follow_hardware_switches_budget_edits_and_undo(tiny_window) -> None:
    from workbench.models.hardware import load_profile

    window = tiny_window
    panel = window.planner_panel
    laptop = load_profile("cpu-laptop-16gb")
    window.hardware_selector.add_profile(laptop)
    window.hardware_selector.select_name("test-2x24g")
    window.hardware_selector.setCurrentIndex(window.hardware_selector.findData(laptop.name))
    assert [lane.device for lane in window.lanes.lanes] == ["cpu", "disk"]
    assert panel.budget_editor.budgets() == window.session.budgets == laptop.budgets()
    assert set(panel.request().budgets) == {"cpu", "disk"}
    window.budget_editor.spin_boxes["cpu"].setValue(3.0)  # the user edits the session budget
    assert panel.budget_editor.budgets()["cpu"] == 3 * GIB == window.session.budgets["cpu"]
    window.undo_stack.undo()
    assert panel.budget_editor.budgets()["cpu"] == laptop.budgets()["cpu"]
    window.undo_stack.undo()  # back to the two-GPU profile
    assert _planner_devices(window) == [0, 1, "cpu", "disk"]
    assert panel.request().budgets == window.session.budgets


def test_a_stale_comparison_never_writes_old_budgets_back(qtbot, tiny_window) -> None:
    window = tiny_window
    panel = window.planner_panel
    budgets = {0: 1300, 1: 1300, "cpu": 10_000, "disk": 10**9}
    compare_strategies(qtbot, window, budgets)
    button = panel.apply_buttons["sequential"]
    assert button.isEnabled()
    window.budget_editor.spin_boxes[0].setValue(5.0)  # session budgets change after Compare
    edited = dict(window.session.budgets)
    assert edited[0] == 5 * GIB
    assert not button.isEnabled() and "compare again" in button.toolTip()
    assert panel.stale_label.isVisibleTo(panel) and "compare again" in panel.stale_label.text()
    assert not panel.apply("sequential")
    assert window.session.budgets == edited  # nothing written back
    assert "compare again" in window.statusBar().currentMessage()
    window.undo_stack.undo()  # the session is back where the comparison was made
    assert button.isEnabled() and not panel.stale_label.isVisibleTo(panel)
    button.click()
    assert window.session.budgets == budgets
    assert window.undo_stack.undoText() == "Apply sequential plan"


def test_an_applied_plan_in_another_dtype_carries_it_into_the_session_and_lanes(
    qtbot, tiny_window
) -> None:
    import torch

    window = tiny_window
    panel = window.planner_panel
    assert window.session.tree.planning_dtype is None  # the tree counts float32 as stored
    panel.dtype_combo.setCurrentText("float16")
    budgets = {0: 700, 1: 700, "cpu": 10_000, "disk": 10**9}  # fits only in float16
    compare_strategies(qtbot, window, budgets)
    plan = panel.candidate("sequential").plan
    panel.apply_buttons["sequential"].click()
    assert window.session.dtype == "float16"
    assert window.session.tree.planning_dtype == torch.float16
    assert window.lanes.is_valid, window.lanes.problems
    used = {lane.device: lane.state.used_bytes for lane in window.lanes.lanes}
    assert {d: n for d, n in used.items() if n} == plan.per_device_bytes
    assert "float16" in window.model_status.text()
    window.undo_stack.undo()  # one step takes the dtype back too
    assert window.session.dtype is None and window.session.tree.planning_dtype is None
    assert window.session.device_map == {"": "cpu"}
    assert window.tree_model.tree is window.session.tree


def test_planner_reasons_leave_the_tooltips_when_the_plan_is_undone(qtbot, tiny_window) -> None:
    window = tiny_window
    panel = window.planner_panel
    compare_strategies(qtbot, window, {0: 1300, 1: 1300, "cpu": 10_000, "disk": 10**9})
    panel.apply_buttons["sequential"].click()

    def tooltip() -> str:
        return window.tree_model.index_of("layers.0").data(Qt.ItemDataRole.ToolTipRole)

    assert "<i>planner:</i>" in tooltip()
    window.undo_stack.undo()
    assert "planner:" not in tooltip()
    window.undo_stack.redo()
    assert "<i>planner:</i>" in tooltip()


def _press_plan(qtbot, window) -> None:
    """Trigger Plan (Ctrl+P) and wait until its plan is applied (or refused)."""
    panel = window.planner_panel
    with qtbot.waitSignal(panel.comparison_ready, timeout=30_000):
        window.actions_by_name["plan"].trigger()
    qtbot.waitUntil(lambda: not panel.thread.isRunning(), timeout=5000)


def test_a_plan_equal_to_the_current_map_applies_nothing(qtbot, tiny_window) -> None:
    window = tiny_window
    panel = window.planner_panel
    panel.reserve_by_bytes.setChecked(True)
    panel.reserve_gib.setValue(0)
    _press_plan(qtbot, window)
    assert window.undo_stack.count() == 1
    planned = dict(window.session.device_map)
    window.session.mark_clean()  # as after saving: the map now equals the plan
    assert not window.session.dirty and not window.windowTitle().startswith("*")
    _press_plan(qtbot, window)
    assert window.session.device_map == planned
    assert window.undo_stack.count() == 1  # no second, empty undo step
    assert not window.session.dirty
    assert "*" not in window.windowTitle()
    assert "equals the current map" in window.statusBar().currentMessage()
