"""The tree's "Precision" column, its "Set precision ▸" context menu, and the undo commands
that change the session's precision map.

A row shows the precision that covers the module (its longest covering key in the session's
precision map), "mixed" when keys below it differ, and "—" for the model's dtype. Every change
is a ``QUndoCommand`` on the window's stack, as device moves are: "Set model.layers.3 to int8"
undoes to the map before, bit for bit. A candidate of the joint planner (the Pareto view, the
comparison's "precision+placement" row) is applied as one macro that sets the device map and
the precision map together, so one Ctrl+Z takes both back.

Example:
    >>> push_precision(stack, session, ["model.layers.3"], "int8")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from PySide6.QtGui import QUndoCommand, QUndoStack
from PySide6.QtWidgets import QMenu, QWidget

from workbench.gui.commands import SetBudgetsCommand, SetDeviceMapCommand
from workbench.runtime.precision_session import (
    MENU_PRECISIONS,
    precision_of,
    set_module_precision,
)
from workbench.wording import plural

PRECISION_HEADER = "Precision"
MIXED_PRECISION = "mixed"
MODEL_DTYPE = "—"


class SetPrecisionMapCommand(QUndoCommand):
    """Replace the session's precision map; undo puts the previous one back exactly.

    Args:
        session: the document (``workbench.runtime.session.Session``).
        precision_map: the map after the command.
        text: what the Edit menu and the history show.
        parent: a macro parent, if any.
    """

    def __init__(
        self,
        session: Any,
        precision_map: Mapping[str, str],
        text: str,
        parent: QUndoCommand | None = None,
    ) -> None:
        super().__init__(text, parent)
        self._session = session
        self._before = dict(session.precision_map)
        self._after = dict(precision_map)

    def redo(self) -> None:
        self._session.set_precision_map(dict(self._after), reason=self.text())

    def undo(self) -> None:
        self._session.set_precision_map(dict(self._before), reason=f"Undo {self.text()}")


def push_precision(
    stack: QUndoStack, session: Any, names: Iterable[str], precision: str | None
) -> bool:
    """Set ``names`` to ``precision`` (``None``: clear their keys) as one undo step.

    Returns False, pushing nothing, when the map would not change.

    Raises:
        BadInputError: ``precision`` is not a precision name.
    """
    targets = list(names)
    after = set_module_precision(session.precision_map, targets, precision)
    if after == session.precision_map:
        return False
    what = targets[0] if len(targets) == 1 else plural(len(targets), "module")
    text = f"Set {what} to {precision}" if precision else f"Clear the precision of {what}"
    stack.push(SetPrecisionMapCommand(session, after, text))
    return True


def push_precision_plan(
    stack: QUndoStack,
    session: Any,
    device_map: Mapping[str, Any],
    precision_map: Mapping[str, str],
    *,
    label: str,
    budgets: Mapping[Any, int] | None = None,
) -> bool:
    """Apply a joint-planner candidate: the device map and the precision map (and the budgets
    it was planned for), one undo step.

    Returns False, pushing nothing, when all equal what the session has.
    """
    new_budgets = budgets is not None and dict(budgets) != dict(session.budgets)
    if (
        not new_budgets
        and dict(device_map) == dict(session.device_map)
        and dict(precision_map) == dict(session.precision_map)
    ):
        return False
    stack.beginMacro(f"Apply {label}")
    try:
        if new_budgets:
            stack.push(SetBudgetsCommand(session, dict(budgets or {}), "Set budgets"))
        stack.push(SetPrecisionMapCommand(session, precision_map, "Set precisions"))
        stack.push(SetDeviceMapCommand(session, device_map, "Set map"))
    finally:
        stack.endMacro()
    return True


def precision_text(name: str, precision_map: Mapping[str, str]) -> str:
    """The Precision column of module ``name``: its covering precision, "mixed" when keys
    below it name other precisions, "—" for the model's dtype."""
    own = precision_of(name, precision_map)
    prefix = f"{name}." if name else ""
    below = {
        value for key, value in precision_map.items() if key.startswith(prefix) and key != name
    }
    if below and below != {own}:
        return MIXED_PRECISION
    return own or MODEL_DTYPE


def fill_precision_menu(menu: QMenu, window: Any, names: list[str]) -> None:
    """The "Set precision ▸" submenu for the selected modules: one entry per precision, then
    "Model dtype (clear)"; each entry is one undo step on the window's stack."""
    menu.setEnabled(bool(names) and window.session.tree is not None)
    current = {precision_text(name, window.session.precision_map) for name in names}
    for precision in MENU_PRECISIONS:
        action = menu.addAction(precision)
        action.setCheckable(True)
        action.setChecked(current == {precision})
        action.triggered.connect(
            lambda _c=False, p=precision: set_selection_precision(window, names, p)
        )
    menu.addSeparator()
    clear = menu.addAction("Model dtype (clear)")
    clear.setToolTip("Remove the precision keys of these modules: what covers them applies")
    clear.triggered.connect(lambda _c=False: set_selection_precision(window, names, None))


def set_selection_precision(window: Any, names: list[str], precision: str | None) -> bool:
    """Push the precision edit and say so in the status bar (a refused name too)."""
    changed = push_precision(window.undo_stack, window.session, names, precision)
    what = names[0] if len(names) == 1 else plural(len(names), "module")
    message = f"{what}: {precision or 'model dtype'}" if changed else f"{what}: unchanged"
    window.statusBar().showMessage(message, 4000)
    return changed


def add_precision_menu(menu: QMenu, window: QWidget, names: list[str]) -> QMenu:
    """Add "Set precision" to the tree's context menu (after "Move to")."""
    submenu = menu.addMenu("Set precision")
    submenu.setToolTipsVisible(True)
    fill_precision_menu(submenu, window, names)
    return submenu
