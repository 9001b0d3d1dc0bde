"""The module tree of a GGUF file shows each module's bytes as stored in the file (quantized)
in a "Stored (GGUF)" column beside the bytes once converted; other models hide the column."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from tiny_gguf import write_tiny_gguf

from workbench.gui.tree_model import (
    GGUF_STORED_HEADER,
    SIZE_COLUMN,
    SORT_ROLE,
    STORED_COLUMN,
    ModuleTreeModel,
)

pytestmark = pytest.mark.gui

HORIZONTAL = Qt.Orientation.Horizontal
# One tiny-GGUF block (width 64, 2 heads of 32, 1 KV head, FFN 128), Q8_0 blocks of 32 weights
# in 34 B, norms in F32:
#   q, o: 64*64/32*34 = 4352 B each; k, v: 32*64/32*34 = 2176 B each;
#   gate, up, down: 128*64/32*34 = 8704 B each; 2 norms: 64*4 = 256 B each
LAYER_STORED_NBYTES = 2 * 4352 + 2 * 2176 + 3 * 8704 + 2 * 256  # 39680
# converted to bfloat16: (2*4096 + 2*2048 + 3*8192 + 2*64) params * 2 B
LAYER_PARAMS = 2 * 4096 + 2 * 2048 + 3 * 8192 + 2 * 64  # 36992
LAYER_BF16_NBYTES = LAYER_PARAMS * 2  # 73984


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.Q8_0.gguf"
    write_tiny_gguf(path)
    return path


def test_a_gguf_tree_shows_the_file_bytes_beside_the_converted_ones(
    main_window, open_in_window, tiny_gguf, qtmodeltester
) -> None:
    open_in_window(main_window, tiny_gguf, timeout_ms=300_000)
    model: ModuleTreeModel = main_window.tree_model
    qtmodeltester.check(model)
    assert model.gguf is main_window.session.opened.gguf
    assert model.headerData(STORED_COLUMN, HORIZONTAL) == GGUF_STORED_HEADER
    tip = model.headerData(STORED_COLUMN, HORIZONTAL, Qt.ItemDataRole.ToolTipRole)
    assert "15 Q8_0, 5 F32" in tip
    assert "bfloat16" in model.headerData(SIZE_COLUMN, HORIZONTAL, Qt.ItemDataRole.ToolTipRole)
    assert not main_window.tree_view.header().isSectionHidden(STORED_COLUMN)
    layer = model.index_of("model.layers.0", STORED_COLUMN)
    assert layer.data(SORT_ROLE) == LAYER_STORED_NBYTES
    assert layer.data() == "38.8 KiB"  # 39680 / 1024
    assert model.index_of("model.layers.0", SIZE_COLUMN).data(SORT_ROLE) == LAYER_BF16_NBYTES
    assert layer.data(Qt.ItemDataRole.TextAlignmentRole) & Qt.AlignmentFlag.AlignRight
    # 39680 B * 8 / 36992 weights
    assert "in the GGUF (8.58 bits per weight)" in layer.data(Qt.ItemDataRole.ToolTipRole)


def test_a_folder_tree_hides_the_stored_column(main_window, open_in_window, demo_dir) -> None:
    open_in_window(main_window, demo_dir)
    model: ModuleTreeModel = main_window.tree_model
    assert model.gguf is None
    assert model.headerData(STORED_COLUMN, HORIZONTAL) == "Stored"
    assert main_window.tree_view.header().isSectionHidden(STORED_COLUMN)
    tip = model.index_of("model.layers.0").data(Qt.ItemDataRole.ToolTipRole)
    assert "stored" in tip and "GGUF" not in tip
