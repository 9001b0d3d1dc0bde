"""Keyboard, menus and toolbar of the main window: Ctrl+1..9 after the Edit menu was shown, the
tree's context menu, Ctrl+Z / Ctrl+Shift+Z and the undo history view, actions that wait for a
model or a selection, the toolbar's short Undo / Redo."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu
from user_input import select_rows

from workbench.gui.tree_model import modules_mime_data

pytestmark = pytest.mark.gui


def _press(qtbot, widget, key, modifiers) -> None:
    widget.setFocus()
    qtbot.keyClick(widget, key, modifiers)


def test_ctrl_number_still_moves_after_the_edit_move_menu_was_shown(tiny_window, qtbot) -> None:
    window = tiny_window
    window.move_menu.popup(window.mapToGlobal(QPoint(20, 20)))  # Edit > Move selection to
    qtbot.waitUntil(window.move_menu.isVisible)
    labels = [action.text() for action in window.move_menu.actions()]
    assert labels == ["cuda:0", "cuda:1", "cpu", "disk"]
    window.move_menu.close()
    shortcuts = [a.shortcut().toString() for a in window.findChildren(QAction)]
    assert shortcuts.count("Ctrl+2") == 1  # one action per shortcut: never ambiguous
    select_rows(window, ["layers.3"])
    _press(qtbot, window.tree_view, Qt.Key.Key_2, Qt.KeyboardModifier.ControlModifier)
    assert window.session.device_map["layers.3"] == 1
    window.move_menu.actions()[3].trigger()  # the menu entry itself moves the selection
    assert window.session.device_map["layers.3"] == "disk"


def test_tree_context_menu_moves_the_selection_and_is_deleted_when_closed(
    tiny_window, qtbot
) -> None:
    window = tiny_window
    select_rows(window, ["layers.1"])
    before = len(window.findChildren(QMenu))
    position = window.tree_view.visualRect(
        window.tree_panel.proxy.mapFromSource(window.tree_model.index_of("layers.1"))
    ).center()
    window.tree_view.customContextMenuRequested.emit(position)
    menu = next(m for m in window.findChildren(QMenu) if m.isVisible())
    assert [a.text() for a in menu.actions()] == [
        "Move to",
        "Set precision",
        "Copy name",
        "Expand all below",
    ]
    move_to = menu.actions()[0].menu()
    assert [a.text() for a in move_to.actions()] == ["cuda:0", "cuda:1", "cpu", "disk"]
    next(a for a in move_to.actions() if a.text() == "disk").trigger()
    assert window.session.device_map["layers.1"] == "disk"
    assert window.undo_stack.undoText() == "Move 'layers.1' to disk"
    menu.close()
    qtbot.waitUntil(lambda: len(window.findChildren(QMenu)) == before)
    for _ in range(3):  # right-clicks do not pile menus up under the window
        window.tree_view.customContextMenuRequested.emit(position)
        next(m for m in window.findChildren(QMenu) if m.isVisible()).close()
    qtbot.waitUntil(lambda: len(window.findChildren(QMenu)) == before)
    assert "disk" in [a.text() for a in window.actions_by_name.values()]  # shared, not deleted


def test_ctrl_z_and_ctrl_shift_z_undo_and_redo_through_the_history(tiny_window, qtbot) -> None:
    window = tiny_window
    window.lanes.lane(0).dropMimeData(modules_mime_data(["layers.0"]))
    first = dict(window.session.device_map)
    window.lanes.lane(1).dropMimeData(modules_mime_data(["norm"]))
    second = dict(window.session.device_map)
    history = window.undo_view.model()
    rows = [history.index(r, 0).data() for r in range(history.rowCount())]
    assert rows == ["<opened>", "Move 'layers.0' to cuda:0", "Move 'norm' to cuda:1"]
    _press(qtbot, window.tree_view, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert window.session.device_map == first
    _press(qtbot, window.tree_view, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert window.session.device_map == {"": "cpu"}
    shift_ctrl = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    _press(qtbot, window.tree_view, Qt.Key.Key_Z, shift_ctrl)
    assert window.session.device_map == first
    # clicking a row of the history view jumps to that state
    window.history_dock.show()
    window.history_dock.raise_()
    window.undo_view.setCurrentIndex(history.index(2, 0))
    assert window.session.device_map == second
    window.undo_view.setCurrentIndex(history.index(0, 0))
    assert window.session.device_map == {"": "cpu"}


MODEL_ACTIONS = ("export_map", "export_wrapped", "copy_code", "plan", "diff_file", "diff_history")


@pytest.mark.slow  # opens a what-if config with transformers on a worker thread
def test_actions_that_need_a_model_wait_for_one(main_window, open_in_window, whatif_config) -> None:
    from PySide6.QtGui import QGuiApplication

    window = main_window
    actions = window.actions_by_name
    for name in MODEL_ACTIONS:
        assert not actions[name].isEnabled(), name
        assert "Open a model first" in actions[name].toolTip(), name
    assert not window.move_menu.menuAction().isEnabled()
    load = window.runtime_panels.load_action
    assert not load.isEnabled()
    QGuiApplication.clipboard().setText("before")
    actions["copy_code"].trigger()  # a disabled action does nothing, shortcut or not
    assert QGuiApplication.clipboard().text() == "before"

    open_in_window(window, whatif_config)
    for name in MODEL_ACTIONS:
        assert actions[name].isEnabled(), name
        assert "Open a model first" not in actions[name].toolTip(), name
    assert actions["export_map"].toolTip().startswith("Export the map")
    # a config without weights plans but cannot load: Load stays off and says why
    assert not load.isEnabled() and "no weights" in load.toolTip()
    actions["copy_code"].trigger()
    assert "device_map" in QGuiApplication.clipboard().text()


def test_move_menus_wait_for_a_selection(tiny_window, qtbot) -> None:
    window = tiny_window
    move = window.move_menu.menuAction()
    window.tree_view.clearSelection()
    assert not move.isEnabled() and move.toolTip() == "Select modules in the tree first"
    corner = window.tree_view.viewport().rect().bottomLeft()
    window.tree_view.customContextMenuRequested.emit(corner)
    menu = next(m for m in window.findChildren(QMenu) if m.isVisible())
    assert menu.actions()[0].text() == "Move to" and not menu.actions()[0].isEnabled()
    menu.close()
    select_rows(window, ["layers.1"])
    assert move.isEnabled()


def test_toolbar_undo_keeps_its_text_short_and_names_the_command_in_its_tooltip(
    tiny_window,
) -> None:
    from PySide6.QtWidgets import QToolButton

    from workbench.gui.commands import push_plan

    window = tiny_window
    push_plan(window.undo_stack, window.session, {"": 0}, strategy="balanced")
    undo = window.actions_by_name["undo"]
    button = window.main_toolbar.widgetForAction(undo)
    assert isinstance(button, QToolButton)
    assert button.text() == "Undo"
    assert undo.text() == "&Undo Apply balanced plan"  # the Edit menu keeps the full name
    assert undo.toolTip().startswith("Undo Apply balanced plan")
    window.undo_stack.undo()
    assert window.actions_by_name["redo"].toolTip().startswith("Redo Apply balanced plan")
    assert window.main_toolbar.widgetForAction(window.actions_by_name["redo"]).text() == "Redo"
    assert undo.toolTip().startswith("Nothing to undo")
    assert window.main_toolbar.sizeHint().width() <= 1280  # no » overflow on a laptop
