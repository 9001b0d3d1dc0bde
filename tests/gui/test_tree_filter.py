"""The tree filter: typing opens the tree to the matches, counts them, caps the expansion,
and the filter box and Class column are wide enough to read."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QModelIndex, Qt
from torch import nn

from workbench.gui.tree_model import CLASS_COLUMN, NAME_ROLE, ModuleTreeModel
from workbench.gui.tree_view import (
    FILTER_PLACEHOLDER,
    MAX_EXPANDED_MATCHES,
    ModuleTreePanel,
    matching_nodes,
)
from workbench.models.tree import build_module_tree

pytestmark = pytest.mark.gui


def _panel(qtbot, tree) -> ModuleTreePanel:
    model = ModuleTreeModel()
    panel = ModuleTreePanel(model)
    qtbot.addWidget(panel)
    model.set_tree(tree, {"": "cpu"})  # as the window does: the panel sizes its columns
    panel.resize(400, 600)
    panel.show()
    qtbot.waitExposed(panel)
    return panel


def _type_filter(qtbot, panel: ModuleTreePanel, text: str, expected: str) -> None:
    """Type like a user and wait for the debounced filter to report ``expected``."""
    panel.filter_edit.clear()
    qtbot.keyClicks(panel.filter_edit, text)
    qtbot.waitUntil(lambda: panel.match_label.text() == expected, timeout=5_000)


def _proxy_index(panel: ModuleTreePanel, name: str) -> QModelIndex:
    return panel.proxy.mapFromSource(panel.model.index_of(name))


def _row_in_view(panel: ModuleTreePanel, name: str) -> bool:
    """A row is in view when the proxy keeps it and every ancestor is expanded."""
    index = _proxy_index(panel, name)
    if not index.isValid():
        return False
    parent = index.parent()
    while parent.isValid():
        if not panel.view.isExpanded(parent):
            return False
        parent = parent.parent()
    return True


def test_typing_a_filter_expands_every_match_and_counts_them(qtbot, tiny_opened) -> None:
    panel = _panel(qtbot, tiny_opened.tree)
    panel.view.collapseAll()
    _type_filter(qtbot, panel, "mlp", "4 matches")
    assert [node.name for node in panel.matches] == [f"layers.{i}.mlp" for i in range(4)]
    for i in range(4):
        assert panel.view.isExpanded(_proxy_index(panel, f"layers.{i}")), i
        assert _row_in_view(panel, f"layers.{i}.mlp")
    assert panel.view.isExpanded(_proxy_index(panel, "layers"))
    _type_filter(qtbot, panel, "layers.2.attn", "1 match")
    _type_filter(qtbot, panel, "q_proj", "no matches")
    assert panel.proxy.rowCount() == 0
    panel.filter_edit.clear()
    qtbot.waitUntil(lambda: panel.match_label.text() == "", timeout=5_000)
    assert panel.proxy.rowCount() == 4  # embed, layers, norm, head


def test_match_count_agrees_with_the_rows_the_proxy_shows(qtbot, tiny_opened) -> None:
    panel = _panel(qtbot, tiny_opened.tree)
    panel.regex_check.setChecked(True)
    _type_filter(qtbot, panel, r"layers\.[13]($|\.attn)", "4 matches")
    shown = []

    def walk(parent: QModelIndex) -> None:
        for row in range(panel.proxy.rowCount(parent)):
            index = panel.proxy.index(row, 0, parent)
            shown.append(index.data(NAME_ROLE))
            walk(index)

    walk(QModelIndex())
    assert set(shown) - {"layers"} == {node.name for node in panel.matches}
    assert matching_nodes(tiny_opened.tree, "LAYERS.1", regex=False)[0].name == "layers.1"


@pytest.mark.slow  # builds a tree of 4,400 modules
def test_many_matches_expand_only_the_first_ones_and_say_so(qtbot) -> None:
    blocks = MAX_EXPANDED_MATCHES + 200
    model = nn.ModuleList(nn.Sequential(nn.Identity()) for _ in range(blocks))
    panel = _panel(qtbot, build_module_tree(model))
    expected = f"{blocks:,} matches (first {MAX_EXPANDED_MATCHES:,} expanded)"
    panel.regex_check.setChecked(True)
    _type_filter(qtbot, panel, r"\.0$", expected)
    assert "Narrow the filter" in panel.match_label.toolTip()
    assert panel.view.isExpanded(_proxy_index(panel, "0"))
    assert panel.view.isExpanded(_proxy_index(panel, str(MAX_EXPANDED_MATCHES - 1)))
    assert not panel.view.isExpanded(_proxy_index(panel, str(MAX_EXPANDED_MATCHES)))
    assert panel.proxy.rowCount() == blocks  # every match stays in the tree, folded


def test_return_selects_the_first_match(qtbot, tiny_opened) -> None:
    panel = _panel(qtbot, tiny_opened.tree)
    qtbot.keyClicks(panel.filter_edit, "attn")
    qtbot.keyClick(panel.filter_edit, Qt.Key.Key_Return)
    assert panel.match_label.text() == "4 matches"
    assert panel.view.currentIndex().data(NAME_ROLE) == "layers.0.attn"


def test_filter_box_fits_its_placeholder_and_class_column_fits_long_names(qtbot) -> None:
    class LlamaDecoderLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(2, 2)

    panel = _panel(qtbot, build_module_tree(nn.ModuleList(LlamaDecoderLayer() for _ in range(2))))
    panel.resize(panel.minimumSizeHint().width(), 600)  # as narrow as the layout allows
    qtbot.waitUntil(lambda: panel.width() == panel.minimumSizeHint().width(), timeout=5_000)
    edit = panel.filter_edit
    text_px = edit.fontMetrics().horizontalAdvance(FILTER_PLACEHOLDER)
    assert edit.width() >= text_px + 16
    class_px = panel.view.fontMetrics().horizontalAdvance("LlamaDecoderLayer")
    assert panel.view.header().sectionSize(CLASS_COLUMN) >= class_px + 8
