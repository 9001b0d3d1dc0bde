"""The tree's Precision column and its "Set precision" context menu: each edit one undo step,
the lanes count the quantized bytes, the session file and the wrapped map keep the map."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from user_input import select_rows

from workbench.gui.map_io import export_device_map
from workbench.gui.precision_column import precision_text
from workbench.gui.tree_model import PRECISION_COLUMN, SIZE_COLUMN, ModuleTreeModel
from workbench.runtime import load_device_map
from workbench.runtime.session import Session, SessionFileError

pytestmark = pytest.mark.gui


@pytest.fixture
def precision_window(main_window, tiny_opened):
    """``main_window`` on ``tiny_opened`` (float32, everything on cpu); the quantizable
    weights are read from the config's declared dtype (none: the tree's float32)."""
    opened = type(tiny_opened)(**{**tiny_opened.__dict__, "declared_dtype": None})
    main_window.set_opened("tiny-lm", opened, {"": "cpu"})
    return main_window


def _context_menu_for(window, name: str):
    """Select ``name`` in the tree and open the tree's context menu on its row."""
    select_rows(window, [name])
    view = window.tree_view
    index = window.tree_panel.proxy.mapFromSource(window.tree_model.index_of(name))
    menu = window._show_tree_context_menu(view.visualRect(index).center())
    submenus = {a.text(): a.menu() for a in menu.actions() if a.menu() is not None}
    return menu, submenus["Set precision"]


def test_set_precision_from_the_context_menu_is_one_undo_step(qtbot, precision_window) -> None:
    window = precision_window
    menu, precision_menu = _context_menu_for(window, "layers.1")
    entries = {a.text(): a for a in precision_menu.actions() if a.text()}
    assert {"int8", "int4-g128", "nf4", "bfloat16", "Model dtype (clear)"} <= set(entries)
    depth = window.undo_stack.count()
    entries["int8"].trigger()
    menu.close()
    session = window.session
    assert session.precision_map == {"layers.1": "int8"}
    assert window.undo_stack.count() == depth + 1
    assert window.undo_stack.undoText() == "Set layers.1 to int8"
    model = window.tree_model
    assert model.index_of("layers.1", PRECISION_COLUMN).data() == "int8"
    assert model.index_of("layers.1.mlp", PRECISION_COLUMN).data() == "int8"
    assert model.index_of("layers.0", PRECISION_COLUMN).data() == "—"
    assert model.index_of("layers", PRECISION_COLUMN).data() == "mixed"
    # the lanes count the int8 bytes: each Linear(8, 8) weight 256 B -> 8*8 + 5*8 = 104 B,
    # biases stay: 2848 - 2 * (256 - 104) = 2544 B on cpu
    assert window.lanes.lane("cpu").state.used_bytes == 2544
    window.undo_stack.undo()
    assert session.precision_map == {}
    assert model.index_of("layers.1", PRECISION_COLUMN).data() == "—"
    assert window.lanes.lane("cpu").state.used_bytes == 2848


def test_clearing_goes_back_to_what_covers_the_module(qtbot, precision_window) -> None:
    window = precision_window
    session = window.session
    menu, precision_menu = _context_menu_for(window, "layers")
    next(a for a in precision_menu.actions() if a.text() == "int4-g128").trigger()
    menu.close()
    menu, precision_menu = _context_menu_for(window, "layers.2")
    next(a for a in precision_menu.actions() if a.text() == "bfloat16").trigger()
    menu.close()
    assert session.precision_map == {"layers": "int4-g128", "layers.2": "bfloat16"}
    menu, precision_menu = _context_menu_for(window, "layers.2")
    checked = [a.text() for a in precision_menu.actions() if a.isChecked()]
    assert checked == ["bfloat16"]
    next(a for a in precision_menu.actions() if a.text() == "Model dtype (clear)").trigger()
    menu.close()
    assert session.precision_map == {"layers": "int4-g128"}
    assert window.tree_model.index_of("layers.2", PRECISION_COLUMN).data() == "int4-g128"
    assert window.undo_stack.undoText() == "Clear the precision of layers.2"


def test_precision_text_and_the_model_pass_the_model_tester(qtmodeltester, tiny_opened) -> None:
    model = ModuleTreeModel()
    model.set_tree(tiny_opened.tree, {"": "cpu"})
    model.set_precision_map({"layers.0": "int8", "layers.0.mlp": "nf4"})
    qtmodeltester.check(model)
    assert precision_text("layers.0", {"layers.0": "int8", "layers.0.mlp": "nf4"}) == "mixed"
    assert precision_text("layers.0.mlp", {"layers.0": "int8", "layers.0.mlp": "nf4"}) == "nf4"
    assert precision_text("layers.0.attn", {"layers.0": "int8", "layers.0.mlp": "nf4"}) == "int8"
    assert precision_text("", {}) == "—"


def test_the_session_file_and_the_wrapped_map_keep_the_precision_map(
    qtbot, precision_window, tmp_path
) -> None:
    window = precision_window
    menu, precision_menu = _context_menu_for(window, "layers.3")
    next(a for a in precision_menu.actions() if a.text() == "int8").trigger()
    menu.close()
    saved = window.session.save(tmp_path / "s.json")
    assert Session.restore(saved).precision_map == {"layers.3": "int8"}
    target = export_device_map(window, tmp_path / "map.json", wrapped=True)
    document = json.loads(target.read_text())
    section = document["quantization"]
    assert section["precision_map"] == {"layers.3": "int8"}
    assert section["keep_high_precision"]  # the tied head (the transformers default)
    assert load_device_map(target) == {"": "cpu"}  # still a map every reader loads
    plain = json.loads(export_device_map(window, tmp_path / "plain.json").read_text())
    assert plain == {"": "cpu"}  # the plain form stays the transformers format


def test_a_session_file_with_a_bad_precision_map_is_a_named_error(tmp_path) -> None:
    data = Session().to_dict()
    data["precision_map"] = {"layers.0": 8}
    with pytest.raises(SessionFileError, match=r"precision map .* 'layers.0'"):
        Session.from_dict(data)


def test_the_size_column_counts_the_precision(qtbot, precision_window) -> None:
    """Each Linear(8, 8) weight of layers.1 at int8: 256 B -> 104 B (the lanes' arithmetic
    above), so the layer's Size drops by 2 x 152 B and its tooltip names both figures."""
    window = precision_window
    model = window.tree_model
    before = {name: model.index_of(name, SIZE_COLUMN).data() for name in ("layers.1", "layers")}
    layer_bytes = window.session.tree.node("layers.1").nbytes
    menu, precision_menu = _context_menu_for(window, "layers.1")
    next(a for a in precision_menu.actions() if a.text() == "int8").trigger()
    menu.close()
    assert model.index_of("layers.1", SIZE_COLUMN).data() == f"{layer_bytes - 2 * 152} B"
    assert model.index_of("layers", SIZE_COLUMN).data() != before["layers"]  # the parent too
    assert f"({layer_bytes} B before quantization)" in model.index_of("layers.1").data(
        Qt.ItemDataRole.ToolTipRole
    )
    window.undo_stack.undo()
    assert model.index_of("layers.1", SIZE_COLUMN).data() == before["layers.1"]
