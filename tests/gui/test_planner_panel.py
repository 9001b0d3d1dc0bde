"""The planner panel: strategies side by side, traces in tooltips, apply as one undo step."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from workbench.gui.planner_panel import run_comparison

pytestmark = pytest.mark.gui


def _compare(qtbot, window, budgets: dict) -> list:
    panel = window.planner_panel
    panel.budget_editor.set_budgets(budgets)
    panel.reserve_by_bytes.setChecked(True)
    panel.reserve_gib.setValue(0)
    with qtbot.waitSignal(panel.comparison_ready, timeout=30_000) as blocker:
        thread = panel.compare()
        assert thread is not None
    qtbot.waitUntil(lambda: not thread.isRunning(), timeout=5000)
    return blocker.args[0]


def test_compare_fills_the_table_and_apply_is_one_undo_step(qtbot, tiny_window) -> None:
    window = tiny_window
    panel = window.planner_panel
    # 2848 B in total; blocks of 576 B are no-split; GPU 0 holds 1300 B, GPU 1 1300 B
    budgets = {0: 1300, 1: 1300, "cpu": 10_000, "disk": 10**9}
    candidates = _compare(qtbot, window, budgets)
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
    assert panel.apply("sequential")
    assert window.session.device_map == sequential.plan.device_map
    assert window.session.budgets == budgets
    assert (
        window.undo_stack.count() == 1 and window.undo_stack.undoText() == "Apply sequential plan"
    )
    tooltip = window.tree_model.index_of("layers.0.mlp").data(Qt.ItemDataRole.ToolTipRole)
    assert "<i>planner:</i> " in tooltip
    window.undo_stack.undo()
    assert window.session.device_map == before


def test_a_strategy_that_cannot_fit_shows_its_error_and_cannot_apply(qtbot, tiny_window) -> None:
    window = tiny_window
    panel = window.planner_panel
    for strategy, check in panel.strategy_checks.items():
        check.setChecked(strategy == "sequential")
    candidates = _compare(qtbot, window, {0: 100, 1: 100, "cpu": 100, "disk": 200})
    assert len(candidates) == 1 and candidates[0].plan is None and candidates[0].error
    assert not panel.apply_buttons["sequential"].isEnabled()
    assert not panel.apply("sequential")
    assert window.undo_stack.count() == 0


def test_run_comparison_predicts_speed_for_each_plan(tiny_window) -> None:
    request = tiny_window.planner_panel.request()
    candidates = run_comparison(request)
    fitted = [c for c in candidates if c.plan is not None]
    assert fitted and all(
        c.prediction is not None and c.prediction.tokens_per_s > 0 for c in fitted
    )
