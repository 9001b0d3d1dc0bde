"""What a user does with the mouse, for GUI tests: select tree rows, drop files on the window."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QItemSelectionModel, QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent


def select_rows(window: Any, names: list[str]) -> None:
    """Expand the tree and select exactly the rows of ``names`` in the view."""
    panel = window.tree_panel
    panel.view.expandAll()
    selection = panel.view.selectionModel()
    selection.clearSelection()
    for name in names:
        index = panel.proxy.mapFromSource(window.tree_model.index_of(name))
        assert index.isValid(), name
        selection.select(
            index, QItemSelectionModel.SelectionFlag.Select | QItemSelectionModel.SelectionFlag.Rows
        )


def drop_file(window: Any, path: Any) -> QDropEvent:
    """Drop ``path`` (a file or folder) on ``window`` as a file manager would; return the event."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    event = QDropEvent(
        QPointF(10, 10),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    window.dropEvent(event)
    return event


def compare_strategies(qtbot: Any, window: Any, budgets: dict) -> list:
    """Set ``budgets`` (no reserve) in the planner panel, press Compare, return the candidates
    once the comparison thread has finished. The budgets go in as an edit of the panel's
    editor (the session's budgets: one budget per device, one undo step)."""
    panel = window.planner_panel
    panel.budget_editor.budgets_edited.emit(dict(budgets))
    panel.reserve_by_bytes.setChecked(True)
    panel.reserve_gib.setValue(0)
    with qtbot.waitSignal(panel.comparison_ready, timeout=30_000) as blocker:
        thread = panel.compare()
        assert thread is not None
    qtbot.waitUntil(lambda: not thread.isRunning(), timeout=5000)
    return blocker.args[0]
