"""Every change to the map goes through one ``QUndoStack`` as one of these commands.

Each command stores the exact before and after values, so undo restores the map bit for bit
whatever happened in between. Widgets never mutate the session directly: they build a command
and push it (``push_move``, ``push_plan``, ...). A planner run is one macro (map + budgets +
reserve), so one Ctrl+Z takes it all back.

Example:
    >>> stack.push(SetDeviceMapCommand(session, {"": 0}, "Put everything on cuda:0"))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from PySide6.QtGui import QUndoCommand, QUndoStack

from workbench.runtime.map_edits import MoveResult, move_modules


def _copy_map(device_map: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(device_map or {})


class SetDeviceMapCommand(QUndoCommand):
    """Replace the session's device map; undo puts the previous one back exactly.

    Args:
        session: the document (``workbench.runtime.session.Session``).
        device_map: the map after the command.
        text: what the Edit menu and the history show, e.g. ``"Move 3 modules to cuda:0"``.
        parent: a macro parent, if any.
    """

    def __init__(
        self,
        session: Any,
        device_map: Mapping[str, Any],
        text: str,
        parent: QUndoCommand | None = None,
    ) -> None:
        super().__init__(text, parent)
        self._session = session
        self._before = _copy_map(session.device_map)
        self._after = _copy_map(device_map)

    @property
    def before(self) -> dict[str, Any]:
        """The map before the command."""
        return dict(self._before)

    @property
    def after(self) -> dict[str, Any]:
        """The map after the command."""
        return dict(self._after)

    def redo(self) -> None:
        self._session.set_device_map(dict(self._after), reason=self.text())

    def undo(self) -> None:
        self._session.set_device_map(dict(self._before), reason=f"Undo {self.text()}")


class SetBudgetsCommand(QUndoCommand):
    """Replace the per-device budgets (and optionally the reserve) of the session."""

    def __init__(
        self,
        session: Any,
        budgets: Mapping[Any, int],
        text: str,
        *,
        reserve: Mapping[Any, int] | int | None = None,
        parent: QUndoCommand | None = None,
    ) -> None:
        super().__init__(text, parent)
        self._session = session
        self._before = (dict(session.budgets or {}), _reserve_copy(session.reserve))
        self._after = (
            dict(budgets),
            _reserve_copy(session.reserve) if reserve is None else _reserve_copy(reserve),
        )

    def redo(self) -> None:
        set_budgets(self._session, *self._after)

    def undo(self) -> None:
        set_budgets(self._session, *self._before)


class SetProfileCommand(QUndoCommand):
    """Switch the hardware profile and take its budgets (undo restores both)."""

    def __init__(self, session: Any, profile: Any, parent: QUndoCommand | None = None) -> None:
        super().__init__(f"Use hardware {profile.name}", parent)
        self._session = session
        self._before = (session.profile, dict(session.budgets or {}))
        self._after = (profile, dict(profile.budgets()))

    def redo(self) -> None:
        self._session.set_profile(self._after[0], reason=self.text())
        self._session.set_budgets(dict(self._after[1]), reason=self.text())

    def undo(self) -> None:
        self._session.set_profile(self._before[0], reason=f"Undo {self.text()}")
        self._session.set_budgets(dict(self._before[1]), reason=f"Undo {self.text()}")


class SetPlanningDtypeCommand(QUndoCommand):
    """Switch the session to a model re-sized in another planning dtype (and load dtype).

    Args:
        session: the document.
        opened: the ``OpenedModel`` whose tree counts bytes in ``dtype``.
        dtype: the dtype name (``"float16"``) or ``None`` for as stored.
        parent: a macro parent, if any.
    """

    def __init__(
        self, session: Any, opened: Any, dtype: str | None, parent: QUndoCommand | None = None
    ) -> None:
        super().__init__(f"Plan in {dtype or 'the stored dtype'}", parent)
        self._session = session
        self._before = (session.opened, session.dtype)
        self._after = (opened, dtype)

    def redo(self) -> None:
        self._apply(*self._after)

    def undo(self) -> None:
        self._apply(*self._before)

    def _apply(self, opened: Any, dtype: str | None) -> None:
        self._session.set_dtype(dtype, reason=self.text())
        self._session.set_opened(opened)


def _reserve_copy(reserve: Any) -> Any:
    return dict(reserve) if isinstance(reserve, Mapping) else reserve


def set_budgets(session: Any, budgets: Mapping[Any, int], reserve: Any) -> None:
    """Write budgets and the reserve into the session through its setters."""
    session.set_budgets(dict(budgets), reason="budgets")
    if reserve is not None and reserve != session.reserve:
        session.set_reserve(int(reserve), reason="reserve")


def push_move(stack: QUndoStack, session: Any, names: Iterable[str], device: Any) -> MoveResult:
    """Move modules to a device as one undoable step and return what moved.

    Raises:
        MoveRefused: when the move would split a no-split module (nothing is pushed).
    """
    result = move_modules(session.tree, session.device_map or {}, names, device)
    stack.push(SetDeviceMapCommand(session, result.device_map, result.describe()))
    return result


def push_plan(
    stack: QUndoStack,
    session: Any,
    device_map: Mapping[str, Any],
    *,
    strategy: str,
    budgets: Mapping[Any, int] | None = None,
    reserve: Any = None,
    opened: Any = None,
    dtype: str | None = None,
) -> bool:
    """Apply a planner result (map and the budgets it was planned for) as one macro.

    Returns False, pushing nothing, when the result equals what the session has already
    (same map, budgets, reserve and model): an identical plan is no edit and no undo step.

    Args:
        opened: the model re-sized in the plan's ``dtype`` when it differs from the session's
            tree; the macro then also switches the session to it, so the lanes count the bytes
            the plan counted.
    """
    if not plan_changes(session, device_map, budgets=budgets, reserve=reserve, opened=opened):
        return False
    stack.beginMacro(f"Apply {strategy} plan")
    try:
        if opened is not None:
            stack.push(SetPlanningDtypeCommand(session, opened, dtype))
        if budgets is not None:
            stack.push(SetBudgetsCommand(session, budgets, "Set budgets", reserve=reserve))
        stack.push(SetDeviceMapCommand(session, device_map, f"Set map from {strategy} plan"))
    finally:
        stack.endMacro()
    return True


def plan_changes(
    session: Any,
    device_map: Mapping[str, Any],
    *,
    budgets: Mapping[Any, int] | None = None,
    reserve: Any = None,
    opened: Any = None,
) -> bool:
    """True when applying this plan would change the session (map, budgets, reserve, model)."""
    if opened is not None and opened is not session.opened:
        return True
    if budgets is not None and dict(budgets) != dict(session.budgets or {}):
        return True
    if reserve is not None and _reserve_copy(reserve) != _reserve_copy(session.reserve):
        return True
    return _copy_map(device_map) != _copy_map(session.device_map)
