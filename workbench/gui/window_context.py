"""What the window's helpers need from the window, as a ``typing.Protocol``.

Dialogs and panels (map import/export, diffs, the planner, the demo start-up, the runtime
panels) receive a ``WindowContext`` instead of ``MainWindow``: they depend on these few names,
not on the window's module, so no helper imports the window and the window imports them all
without a ring. ``MainWindow`` satisfies every protocol here; a test may pass any object that
does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from PySide6.QtGui import QUndoStack
from PySide6.QtWidgets import QProgressBar, QStatusBar, QUndoView

from workbench.runtime.session import Session

MessageSink = Callable[[str, str], None]
"""Shows a message box: ``(title, text)``."""


class StatusContext(Protocol):
    """A parent widget with a status bar and a busy indicator (the demo start-up)."""

    busy_bar: QProgressBar

    def statusBar(self) -> QStatusBar: ...

    def isVisible(self) -> bool: ...

    def open_source(self, source: str) -> Any: ...


class WindowContext(Protocol):
    """The document, its undo stack, messages and the hardware, for dialogs and panels.

    The object is also the Qt parent of what the helper shows (a ``QWidget`` at run time).
    """

    session: Session
    undo_stack: QUndoStack
    undo_view: QUndoView  # the History dock (Diff against earlier state reads its selection)

    def statusBar(self) -> QStatusBar: ...

    def show_error(self, title: str, text: str) -> None: ...

    def show_info(self, title: str, text: str) -> None: ...

    def hardware_profile(self) -> Any: ...

    def execution_device(self) -> int | str: ...

    def open_replacing(self, source: str) -> None: ...


class PlannerHost(WindowContext, Protocol):
    """What the Planner panel needs besides a ``WindowContext``: budget edits as undo steps
    and the tree, which shows each module's "why"."""

    tree_model: Any  # a ModuleTreeModel (set_trace)

    def edit_budgets(self, budgets: dict[int | str, int]) -> None: ...


class DocumentHost(WindowContext, Protocol):
    """What ``SessionDocuments`` needs besides a ``WindowContext``: opening a model, the
    "Unload it?" question, closing, the recent list and the active hardware profile."""

    def open_source(self, source: str) -> Any: ...

    def confirm_loaded_model(
        self, then: Callable[[], object], source: str | None = None
    ) -> Any: ...

    def close(self) -> bool: ...

    def refresh_recent_menu(self) -> None: ...

    def adopt_profile(self, profile: Any) -> None: ...


__all__ = ["DocumentHost", "MessageSink", "PlannerHost", "StatusContext", "WindowContext"]
