"""What the window shows about the map: the validity label's colour, the reserve share in the
lanes, expand-to-depth and search in the tree."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor

from workbench.gui.tree_model import NAME_ROLE, modules_mime_data
from workbench.resources import resource_path

pytestmark = pytest.mark.gui


def _red_pixels(widget) -> int:
    image = widget.grab().toImage()
    count = 0
    for x in range(image.width()):
        for y in range(image.height()):
            color = QColor(image.pixel(x, y))
            count += color.red() > 160 and color.green() < 100 and color.blue() < 100
    return count


def test_map_invalid_label_turns_red_and_back(qtbot, tiny_window) -> None:
    window = tiny_window
    window.setStyleSheet(resource_path("styles", "workbench.qss").read_text(encoding="utf-8"))
    label = window.validity_status
    assert label.text().startswith("map valid") and _red_pixels(label) == 0
    window.lanes.lane(0).dropMimeData(modules_mime_data(["layers"]))  # 2304 B on cuda:0
    budgets = dict(window.session.budgets)
    budgets[0] = 2000
    window.budget_editor.budgets_edited.emit(budgets)
    assert label.text() == "over budget"
    assert _red_pixels(label) > 20  # drawn in the style sheet's red, not only flagged
    window.undo_stack.undo()
    assert label.text().startswith("map valid") and _red_pixels(label) == 0


def test_lanes_show_the_reserve_share_on_the_execution_device(tiny_window) -> None:
    window = tiny_window
    window.lanes.lane(0).dropMimeData(modules_mime_data(["layers"]))  # 2304 B on cuda:0
    budgets = {0: 3000, 1: 3000, "cpu": 10_000, "disk": 10**9}
    window.budget_editor.budgets_edited.emit(budgets)
    window.session.set_reserve(500, reason="test")
    cuda0, cuda1 = window.lanes.lane(0), window.lanes.lane(1)
    assert (cuda0.state.used_bytes, cuda0.state.reserve_bytes) == (2304, 500)
    assert cuda1.state.reserve_bytes == 0  # only the execution device keeps the reserve
    assert "2.25 KiB + 500 B reserve / 2.93 KiB" in cuda0.figures_label.text()
    assert "500 B reserved for activations" in cuda0.bar.toolTip()
    assert window.lanes.is_valid
    window.session.set_reserve(800, reason="test")  # 2304 + 800 > 3000: the reserve counts
    assert cuda0.state.excess_bytes == 104
    assert "cuda:0 over budget by 104 B" in window.lanes.problems


def test_expand_to_depth_opens_exactly_that_many_levels(tiny_window) -> None:
    window = tiny_window
    panel = window.tree_panel
    model, proxy = window.tree_model, panel.proxy

    def expanded(name: str) -> bool:
        return panel.view.isExpanded(proxy.mapFromSource(model.index_of(name)))

    panel.view.collapseAll()
    panel.depth_spin.setValue(1)
    panel.expand_button.click()
    assert expanded("layers") and not expanded("layers.0")
    panel.depth_spin.setValue(2)
    window.actions_by_name["expand"].trigger()  # View > Expand to depth
    assert expanded("layers") and expanded("layers.0")
    panel.collapse_button.click()
    assert not expanded("layers")


def test_search_filters_and_return_jumps_to_the_first_match(qtbot, tiny_window) -> None:
    window = tiny_window
    panel = window.tree_panel
    window.actions_by_name["filter"].trigger()  # Ctrl+F focuses the box
    qtbot.keyClicks(panel.filter_edit, "mlp")
    qtbot.keyClick(panel.filter_edit, Qt.Key.Key_Return)
    assert panel.view.currentIndex().data(NAME_ROLE) == "layers.0.mlp"
    assert panel.proxy.rowCount() == 1  # only "layers" (an ancestor of matches) stays on top
    panel.regex_check.setChecked(True)
    panel.filter_edit.setText(r"layers\.[23]$")
    qtbot.keyClick(panel.filter_edit, Qt.Key.Key_Return)
    assert panel.view.currentIndex().data(NAME_ROLE) == "layers.2"
    layers = panel.proxy.index(0, 0)
    assert [panel.proxy.index(r, 0, layers).data(NAME_ROLE) for r in range(2)] == [
        "layers.2",
        "layers.3",
    ]
    assert panel.proxy.rowCount(layers) == 2
