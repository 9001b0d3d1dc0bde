"""The module tree model: Qt's model tester, columns, device column, drag data, filtering."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QModelIndex, Qt
from torch import nn

from workbench.gui.tree_model import (
    COLUMNS,
    DEVICE_COLUMN,
    DEVICE_ROLE,
    FLAGS_COLUMN,
    NAME_ROLE,
    SIZE_COLUMN,
    SORT_ROLE,
    ModuleTreeModel,
    names_from_mime,
)
from workbench.gui.tree_view import ModuleFilterProxy, ModuleTreePanel
from workbench.models.tree import build_module_tree

pytestmark = pytest.mark.gui


def test_model_passes_qt_model_tester(qtmodeltester, tiny_opened) -> None:
    model = ModuleTreeModel()
    model.set_tree(tiny_opened.tree, {"layers.0": 0, "layers.1": 0, "": "cpu"})
    qtmodeltester.check(model, force_py=True)


def test_proxy_with_filter_passes_qt_model_tester(qtmodeltester, tiny_opened) -> None:
    model = ModuleTreeModel()
    model.set_tree(tiny_opened.tree, {"": "cpu"})
    proxy = ModuleFilterProxy()
    proxy.setSourceModel(model)
    assert proxy.set_pattern("mlp", regex=False) is None
    qtmodeltester.check(proxy, force_py=True)


def test_columns_show_names_sizes_devices_and_flags(tiny_opened) -> None:
    model = ModuleTreeModel()
    model.set_tree(tiny_opened.tree, {"embed": 0, "layers": "cpu", "norm": "disk", "head": 0})
    embed = model.index_of("embed")
    row = [model.index(embed.row(), c).data() for c in range(len(COLUMNS))]
    # embed: 16 x 8 float32 = 512 B (planned and stored), tied with head
    assert row == ["embed", "Embedding", "128", "512 B", "512 B", "cuda:0", "—", "tied"]
    block = model.index_of("layers.2")
    assert model.index(block.row(), FLAGS_COLUMN, block.parent()).data() == "no-split"
    # a Block: 2 x (8 x 8 + 8) x 4 B = 576 B
    assert model.index(block.row(), SIZE_COLUMN, block.parent()).data(SORT_ROLE) == 576
    assert model.index(block.row(), DEVICE_COLUMN, block.parent()).data() == "cpu"


def test_a_tied_output_layer_says_where_its_weight_is_counted(tiny_opened) -> None:
    """The head reads 0 parameters and 0 B: its weight is the embedding's, counted there."""
    model = ModuleTreeModel()
    model.set_tree(tiny_opened.tree, {"": "cpu"})
    head = model.index_of("head")
    assert model.index(head.row(), SIZE_COLUMN).data() == "0 B"
    tip = head.data(Qt.ItemDataRole.ToolTipRole)
    assert "head.weight is embed.weight: counted once, in embed (512 B)" in tip
    assert "counted once" not in model.index_of("embed").data(Qt.ItemDataRole.ToolTipRole)


def test_device_column_follows_map_changes_and_marks_split_parents(tiny_opened) -> None:
    model = ModuleTreeModel()
    model.set_tree(tiny_opened.tree, {"": "cpu"})
    layers = model.index_of("layers", DEVICE_COLUMN)
    assert layers.data(DEVICE_ROLE) == "cpu"
    model.set_device_map({"embed": 0, "layers.0": 0, "layers.1": 1, "layers.2": "cpu"})
    assert model.index_of("layers", DEVICE_COLUMN).data() == "mixed"
    assert model.index_of("layers.1", DEVICE_COLUMN).data() == "cuda:1"
    assert model.index_of("layers.3", DEVICE_COLUMN).data(DEVICE_ROLE) is None  # uncovered
    assert "not covered" in model.index_of("layers.3").data(Qt.ItemDataRole.ToolTipRole)


def test_mime_data_carries_full_names_of_selected_rows(tiny_opened) -> None:
    model = ModuleTreeModel()
    model.set_tree(tiny_opened.tree, {"": "cpu"})
    indexes = [model.index_of("layers.1"), model.index_of("layers.1", 3), model.index_of("norm")]
    assert names_from_mime(model.mimeData(indexes)) == ["layers.1", "norm"]


def test_index_and_parent_reuse_the_session_nodes(tiny_opened) -> None:
    model = ModuleTreeModel()
    model.set_tree(tiny_opened.tree, {"": "cpu"})
    layers = model.index_of("layers")
    child = model.index(3, 0, layers)
    assert child.internalPointer() is tiny_opened.tree.node("layers.3")
    assert model.parent(child).internalPointer() is tiny_opened.tree.node("layers")
    assert model.parent(layers) == QModelIndex()


def test_recursive_regex_filter_keeps_ancestors_of_matches(qtbot, tiny_opened) -> None:
    model = ModuleTreeModel()
    model.set_tree(tiny_opened.tree, {"": "cpu"})
    panel = ModuleTreePanel(model)
    qtbot.addWidget(panel)
    panel.regex_check.setChecked(True)
    panel.filter_edit.setText(r"layers\.[13]\.mlp$")
    panel.apply_filter()
    proxy = panel.proxy
    top = [proxy.index(r, 0).data(NAME_ROLE) for r in range(proxy.rowCount())]
    assert top == ["layers"]
    layers = proxy.index(0, 0)
    assert [proxy.index(r, 0, layers).data(NAME_ROLE) for r in range(proxy.rowCount(layers))] == [
        "layers.1",
        "layers.3",
    ]
    panel.filter_edit.setText("layers.[")  # invalid regex: reported, filter unchanged
    panel.apply_filter()
    assert "invalid regular expression" in panel.filter_edit.toolTip()


def test_sorting_by_size_is_numeric(qtbot, tiny_opened) -> None:
    model = ModuleTreeModel()
    model.set_tree(tiny_opened.tree, {"": "cpu"})
    panel = ModuleTreePanel(model)
    qtbot.addWidget(panel)
    panel.view.sortByColumn(SIZE_COLUMN, Qt.SortOrder.DescendingOrder)
    proxy = panel.proxy
    sizes = [proxy.index(r, SIZE_COLUMN).data(SORT_ROLE) for r in range(proxy.rowCount())]
    assert sizes == sorted(sizes, reverse=True)
    assert proxy.index(0, 0).data(NAME_ROLE) == "layers"  # 2304 B


@pytest.mark.slow  # builds a 20k-module tree
def test_wide_tree_answers_rows_without_creating_nodes(qtbot) -> None:
    wide = nn.ModuleList(nn.Identity() for _ in range(20_000))  # structure only: fast to build
    tree = build_module_tree(wide)
    model = ModuleTreeModel()
    model.set_tree(tree, {"": "cpu"})
    assert model.rowCount() == 20_000
    last = model.index(19_999, 0)
    assert last.internalPointer() is tree.node("19999")
    assert last.data(NAME_ROLE) == "19999"
    assert model.parent(last) == QModelIndex()
