"""Select rows of the main window's module tree as a user would (for GUI tests)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QItemSelectionModel


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
