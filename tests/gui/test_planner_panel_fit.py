"""The planner panel after Compare: warnings reach the table and the trace, every budgeted
device has a row, and the table leaves the Apply buttons and the trace in view."""

from __future__ import annotations

from typing import Any

import pytest
from user_input import compare_strategies

from workbench.runtime.strategy_compare import run_comparison

pytestmark = pytest.mark.gui

# GPUs too small for anything: the whole model goes to cpu, and its buffers, which stay on the
# execution device, fit on no GPU -> the planner warns for every strategy
SMALL_GPUS = {0: 100, 1: 100, "cpu": 1_000_000, "disk": 10**9}


@pytest.fixture(scope="module")
def buffered_opened(tiny_opened: Any) -> Any:
    """``tiny_opened``'s kind of model, with a 128 B buffer in each of its 4 blocks."""
    import torch
    from torch import nn

    from workbench.models.tree import build_module_tree

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.Linear(8, 8)
            self.register_buffer("scale", torch.ones(32))

    class BufferedLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(16, 8)
            self.layers = nn.ModuleList(Block() for _ in range(4))

    with torch.device("meta"):
        model = BufferedLM()
    tree = build_module_tree(model, no_split_classes=["Block"])
    fields = {**tiny_opened.__dict__, "model": model, "tree": tree, "model_class": "BufferedLM"}
    return type(tiny_opened)(**{**fields, "tied_groups": tree.tied_groups, "source": "buffered"})


@pytest.fixture
def buffered_window(main_window: Any, buffered_opened: Any) -> Any:
    main_window.set_opened("buffered", buffered_opened, {"": "cpu"})
    return main_window


def test_run_comparison_keeps_each_strategys_warnings(buffered_window: Any, recwarn) -> None:
    panel = buffered_window.planner_panel
    panel.budget_editor.budgets_edited.emit(SMALL_GPUS)  # an edit: the session's budgets
    candidates = run_comparison(panel.request())
    assert [c.strategy for c in candidates] == ["auto", "balanced", "balanced_low_0", "sequential"]
    for candidate in candidates:
        assert candidate.plan is not None, candidate.error
        assert len(candidate.warnings) == 1 and "512 B of buffers" in candidate.warnings[0]
    assert len(recwarn) == 0  # caught for the table, not sent to the console


def test_a_planner_warning_shows_in_the_status_cell_trace_and_status_bar(
    qtbot: Any, buffered_window: Any
) -> None:
    window = buffered_window
    panel = window.planner_panel
    compare_strategies(qtbot, window, SMALL_GPUS)
    table = panel.table
    rows = [table.verticalHeaderItem(r).text() for r in range(table.rowCount())]
    # the GPUs the plans leave empty keep their rows: 0 B says they are unused
    assert rows == ["cuda:0", "cuda:1", "cpu", "disk", "tokens/s", "TTFT", "status"]
    for column in range(table.columnCount()):
        assert table.item(0, column).text() == table.item(1, column).text() == "0 B"
        assert table.item(0, column).toolTip() == "0 B of 100 B"
        status = table.item(rows.index("status"), column)
        assert status.text() == "plan only, 1 warning"  # a model without weights
        assert "warning: offloaded modules hold 512 B of buffers" in status.toolTip()
    panel.show_trace("balanced")
    first = panel.trace_view.topLevelItem(0)
    assert first.text(0) == "(warning)" and "512 B of buffers" in first.text(3)
    assert panel.trace_view.topLevelItem(1).text(0) != "(warning)"
    assert "Planner warning" in window.statusBar().currentMessage()
    assert panel.apply_buttons["balanced"].isEnabled()  # a warning does not block the plan


def test_without_warnings_the_status_says_ok(qtbot: Any, tiny_window: Any) -> None:
    panel = tiny_window.planner_panel
    candidates = compare_strategies(
        qtbot, tiny_window, {0: 1300, 1: 1300, "cpu": 10_000, "disk": 10**9}
    )
    assert all(not c.warnings for c in candidates)
    status_row = panel.table.rowCount() - 1
    # no warning count; "not here": the profile's GPUs are not this machine's
    assert [panel.table.item(status_row, c).text() for c in range(4)] == ["not here"] * 4


def test_after_compare_the_apply_buttons_and_the_trace_are_in_view(
    qtbot: Any, tiny_window: Any
) -> None:
    """The first-run window on a 1920 x 1080 screen (1728 x 972): no scrolling in the dock."""
    from PySide6.QtCore import QRect

    window = tiny_window
    window.resize(1728, 972)
    window._default_dock_sizes()
    panel = window.planner_panel
    compare_strategies(qtbot, window, {0: 1300, 1: 1300, "cpu": 10_000, "disk": 10**9})
    scroll = window.planner_dock.widget()
    table = panel.table
    # the table is as tall as its rows: every row shows (once laid out), and nothing more
    rows_height = table.verticalHeader().length()
    qtbot.waitUntil(lambda: table.viewport().height() >= rows_height, timeout=5000)
    assert table.height() <= rows_height + 2 * table.horizontalHeader().height()
    viewport = QRect(0, 0, scroll.viewport().width(), scroll.viewport().height())

    def in_view(widget: Any) -> bool:
        top_left = widget.mapTo(scroll.viewport(), widget.rect().topLeft())
        return viewport.contains(QRect(top_left, widget.size()))

    assert scroll.verticalScrollBar().maximum() == 0, "the dock scrolls"
    assert all(in_view(button) for button in panel.apply_buttons.values())
    assert in_view(panel.trace_view)
    trace = panel.trace_view
    row_height = trace.sizeHintForRow(0)
    assert row_height > 0 and trace.viewport().height() >= 6 * row_height
