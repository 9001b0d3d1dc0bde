"""The window's actions come from one registry (``workbench.gui.actions``): every declared
action exists once, the menus and the toolbar name only declared actions, no key is bound
twice, and enabled states follow ``WindowState`` in one place."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QAction

from workbench.gui.actions import (
    ACTIONS,
    HARDWARE_SELECTOR,
    MENUS,
    SEPARATOR,
    TOOLBAR,
    SubmenuSpec,
    WindowState,
)

pytestmark = pytest.mark.gui


def test_menus_and_toolbar_name_only_declared_actions() -> None:
    ids = [spec.id for spec in ACTIONS]
    assert len(ids) == len(set(ids))
    placed = [
        item
        for menu in MENUS
        for item in menu.items
        if not isinstance(item, SubmenuSpec) and item not in (SEPARATOR, "docks")
    ]
    placed += [item for item in TOOLBAR if item not in (SEPARATOR, HARDWARE_SELECTOR)]
    assert set(placed) <= set(ids)


def test_the_window_has_each_declared_action_and_each_key_once(main_window) -> None:
    actions = main_window.actions_by_name
    assert set(actions) == {spec.id for spec in ACTIONS}
    keys = [
        key.toString()
        for action in main_window.findChildren(QAction)
        for key in action.shortcuts()
        if not key.isEmpty()
    ]
    assert sorted(keys) == sorted(set(keys))
    assert actions["open_session"].objectName() == "openSessionAction"
    assert actions["open_session"].shortcut().toString() == "Ctrl+Shift+O"


def test_enabled_states_follow_the_window_state(main_window) -> None:
    action_set = main_window.action_set
    actions, move = main_window.actions_by_name, main_window.move_menu.menuAction()
    action_set.refresh(WindowState(has_model=True, has_selection=False))
    assert actions["plan"].isEnabled() and actions["lane_1"].isEnabled()
    assert not move.isEnabled() and move.toolTip() == "Select modules in the tree first"
    action_set.refresh(WindowState(has_model=True, has_selection=True))
    assert move.isEnabled()
    action_set.refresh(WindowState(has_model=False, has_selection=False))
    assert not actions["plan"].isEnabled() and not actions["lane_1"].isEnabled()
    assert actions["plan"].toolTip().endswith("Open a model first (File > Open)")
    assert actions["open_config"].isEnabled()  # needs nothing
