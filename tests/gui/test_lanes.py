"""Device lanes: drops from the tree (real QMimeData through the lane's drop handling),
refusals, tied groups, budgets, uncovered modules, keyboard shortcuts."""

from __future__ import annotations

import warnings

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QDragMoveEvent, QDropEvent
from user_input import select_rows

from workbench.gui.tree_model import modules_mime_data

pytestmark = pytest.mark.gui


def _drop(lane, mime) -> QDropEvent:
    event = QDropEvent(
        QPointF(lane.rect().center()),
        Qt.DropAction.MoveAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    lane.dropEvent(event)
    return event


def test_dropping_selected_rows_moves_them_as_one_undo_step(tiny_window) -> None:
    window = tiny_window
    select_rows(window, ["layers.1", "layers.2"])
    indexes = window.tree_view.selectionModel().selectedIndexes()
    mime = window.tree_panel.proxy.mimeData(indexes)  # what a real drag carries
    event = _drop(window.lanes.lane(0), mime)
    assert event.isAccepted()
    assert window.session.device_map == {
        "embed": "cpu",
        "layers.0": "cpu",
        "layers.1": 0,
        "layers.2": 0,
        "layers.3": "cpu",
        "norm": "cpu",
        "head": "cpu",
    }
    assert window.undo_stack.count() == 1
    assert window.undo_stack.undoText() == "Move 2 modules to cuda:0"
    lane = window.lanes.lane(0)
    assert lane.state.blocks == ("layers.1-2",)
    assert lane.state.used_bytes == 2 * 576  # two blocks of 576 B


def test_moving_a_parent_moves_its_subtree(tiny_window) -> None:
    window = tiny_window
    window.lanes.lane(1).dropMimeData(modules_mime_data(["layers.0"]))
    window.lanes.lane("disk").dropMimeData(modules_mime_data(["layers"]))
    device_map = window.session.device_map
    assert device_map["layers"] == "disk"
    assert not any(key.startswith("layers.") for key in device_map)


def test_splitting_a_no_split_block_is_refused_with_the_reason(tiny_window) -> None:
    window = tiny_window
    before = dict(window.session.device_map)
    refusals: list[str] = []
    window.lanes.move_refused.connect(refusals.append)
    mime = modules_mime_data(["layers.2.mlp"])
    lane = window.lanes.lane(0)
    assert "inside layers.2 (Block)" in lane.refusal(mime)
    hints: list[str] = []
    lane.drag_hint.connect(hints.append)
    with warnings.catch_warnings():  # PySide marks the only QDragMoveEvent constructor deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        move = QDragMoveEvent(
            QPoint(5, 5),
            Qt.DropAction.MoveAction,
            mime,
            Qt.MouseButton.LeftButton,
            Qt.KeyboardModifier.NoModifier,
        )
    lane.dragMoveEvent(move)
    assert not move.isAccepted()
    assert "cannot split a no-split module" in hints[-1]
    event = _drop(lane, mime)
    assert not event.isAccepted()
    assert window.session.device_map == before
    assert window.undo_stack.count() == 0
    assert "Move the whole no-split module instead" in refusals[-1]
    assert "Refused" in window.statusBar().currentMessage()


def test_tied_partner_moves_with_the_module_and_undo_text_says_so(tiny_window) -> None:
    window = tiny_window
    window.lanes.lane(1).dropMimeData(modules_mime_data(["head"]))
    assert window.session.device_map["head"] == 1
    assert window.session.device_map["embed"] == 1  # shares head.weight
    assert window.undo_stack.undoText() == "Move 'head' to cuda:1 (with tied embed)"


def test_over_budget_lane_turns_red_and_map_invalid(tiny_window) -> None:
    window = tiny_window
    window.lanes.lane(0).dropMimeData(modules_mime_data(["layers"]))  # 2304 B on cuda:0
    assert window.lanes.is_valid
    budgets = dict(window.session.budgets)
    budgets[0] = 2000
    window.budget_editor.budgets_edited.emit(budgets)  # the budget editor's signal
    lane = window.lanes.lane(0)
    assert lane.state.over_budget
    assert lane.state.excess_bytes == 2304 - 2000
    assert lane.property("overBudget") is True
    assert "over by 304 B" in lane.figures_label.text()
    assert "cuda:0 over budget by 304 B" in window.lanes.problems
    assert window.validity_status.text() == "over budget"  # it loads: not "map INVALID"
    window.undo_stack.undo()  # the budget edit is undoable too
    assert window.validity_status.text().startswith("map valid")  # (+ why it cannot load here)


def test_a_zero_budget_holds_nothing_and_agrees_with_the_planner(tiny_window, tiny_opened) -> None:
    from workbench.big_modeling import infer_auto_device_map

    window = tiny_window
    budgets = {0: 0, 1: 0, "cpu": 10_000, "disk": 10**9}
    window.budget_editor.budgets_edited.emit(budgets)
    empty = window.lanes.lane(0)
    assert "0 B / 0 B" in empty.figures_label.text()  # an empty device fits a 0 budget
    assert window.lanes.is_valid
    plan = infer_auto_device_map(
        tiny_opened.model, max_memory=budgets, no_split_module_classes=["Block"]
    )
    assert 0 not in plan.values() and 1 not in plan.values()  # the planner uses neither GPU
    window.lanes.lane(0).dropMimeData(modules_mime_data(["layers.0"]))  # 576 B on cuda:0
    lane = window.lanes.lane(0)
    assert lane.state.budget_bytes == 0
    assert lane.state.excess_bytes == 576
    assert lane.property("overBudget") is True
    assert "576 B / 0 B — over by 576 B" in lane.figures_label.text()
    assert "budget 0 B" in lane.bar.toolTip()
    assert "cuda:0 over budget by 576 B" in window.lanes.problems
    assert window.validity_status.text() == "over budget"


def test_only_a_missing_budget_means_no_limit(qtbot, tiny_opened) -> None:
    from workbench.gui.lanes import LanesWidget

    lanes = LanesWidget()
    qtbot.addWidget(lanes)
    device_map = {"": "disk"}
    lanes.update_lanes(tiny_opened.tree, device_map, {"cpu": 0, "disk": None})
    disk = lanes.lane("disk")
    assert disk.state.budget_bytes is None and not disk.state.over_budget
    assert disk.figures_label.text() == "2.78 KiB"  # no "/ budget" without one
    assert lanes.is_valid
    lanes.update_lanes(tiny_opened.tree, device_map, {"cpu": 0, "disk": 0})
    assert lanes.problems == ["disk over budget by 2.78 KiB"]


def test_uncovered_modules_are_listed_as_problems(tiny_window) -> None:
    window = tiny_window
    window.session.set_device_map({"embed": 0, "layers.0": 0, "layers.1": 0}, reason="test")
    problems = window.lanes.problems
    assert problems[0].startswith("4 uncovered: layers.2-3, norm, head")
    assert not window.lanes.is_valid


def test_ctrl_number_moves_the_selection_to_that_lane(tiny_window, qtbot) -> None:
    window = tiny_window
    select_rows(window, ["layers.3"])
    window.tree_view.setFocus()
    qtbot.keyClick(window.tree_view, Qt.Key.Key_2, Qt.KeyboardModifier.ControlModifier)
    assert window.session.device_map["layers.3"] == 1  # lane 2 = cuda:1
    assert [lane.device for lane in window.lanes.lanes] == [0, 1, "cpu", "disk"]
