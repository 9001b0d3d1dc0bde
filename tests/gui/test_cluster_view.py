"""The cluster view: candidates side by side, nodes as device lanes coloured by stage, the
module list banded by stage, export of launch scripts, and the Tools menu entry."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from workbench.gui.cluster_view import ClusterPlanDialog, show_cluster_plan, stage_color
from workbench.models.intake import open_model
from workbench.runtime.formatting import format_nbytes, format_rate

pytestmark = pytest.mark.gui


@pytest.fixture(scope="module")
def llama_8b():
    return open_model("llama-3.1-8b")


def _dialog(qtbot, opened, cluster: str, engine: str = "vllm") -> ClusterPlanDialog:
    dialog = ClusterPlanDialog(opened, model_ref="meta-llama/Llama-3.1-8B")
    qtbot.addWidget(dialog)
    dialog.context_spin.setValue(8192)
    dialog.cluster_combo.setCurrentText(cluster)
    dialog.engine_combo.setCurrentText(engine)
    return dialog


def test_candidates_lanes_and_module_bands_follow_the_selected_candidate(qtbot, llama_8b):
    dialog = _dialog(qtbot, llama_8b, "4x1-rtx4090-10gbe", engine="llama.cpp")
    assert dialog.table.rowCount() == len(dialog.plan.candidates)
    best = dialog.plan.best
    assert best is not None and dialog.selected_candidate() is best
    assert dialog.table.item(0, 0).text() == best.label
    # every GPU a stage runs on is one lane, in that stage
    for stage in best.stages:
        for gpu in stage.gpus:
            assert dialog.lanes_widget.stage_of(stage.node, gpu) is stage
    assert len(dialog.lanes_widget.lanes()) == 4
    # one group per stage (where it runs, its layers, its peak per GPU), its modules inside,
    # all in the stage's colour band: embeddings on the first, lm_head on the last
    groups = [dialog.modules.topLevelItem(i) for i in range(dialog.modules.topLevelItemCount())]
    assert len(groups) == len(best.stages)
    first, last = best.stages[0], best.stages[-1]
    assert groups[0].text(0) == f"{first.node_name} GPU 0, layers 0-{first.layer_count - 1}"
    assert groups[0].text(2) == format_nbytes(first.total_bytes)
    assert groups[0].child(0).text(0) == "model.embed_tokens"
    tail = groups[-1].child(groups[-1].childCount() - 1)
    assert tail.text(0) == "lm_head"
    assert groups[-1].background(1).color() == stage_color(last.index)
    assert tail.background(1).color() == stage_color(last.index)
    # picking another candidate redraws
    other = next(row for row, c in enumerate(dialog.plan.candidates) if c is not best)
    dialog.table.selectRow(other)
    assert dialog.lanes_widget.candidate is dialog.plan.candidates[other]


def test_figures_use_the_app_formatting_and_names_are_not_cut(qtbot):
    # DeepSeek-V3 in fp8 prefills at over 10,000 tok/s: "%.4g" printed that as "2.257e+04"
    dialog = ClusterPlanDialog(open_model("deepseek-v3", dtype="fp8"))
    qtbot.addWidget(dialog)
    dialog.resize(1200, 760)  # as show_cluster_plan opens it
    dialog.show()
    qtbot.waitExposed(dialog)
    texts = [
        dialog.table.item(row, column).text()
        for row in range(dialog.table.rowCount())
        for column in range(dialog.table.columnCount())
    ]
    assert not [text for text in texts if "e+" in text or "e-" in text]
    best = dialog.plan.candidates[0]
    assert dialog.table.item(0, 3).text() == format_rate(best.decode_tokens_per_s)
    assert dialog.table.item(0, 5).text() == format_rate(best.prefill_tokens_per_s)
    assert best.prefill_tokens_per_s > 10_000 and "," in dialog.table.item(0, 5).text()
    assert "e+" not in dialog.status_label.text()
    # every column as wide as its widest cell; the module names (a stage's group and its
    # modules, indented) are not elided, and the stage and per-GPU columns fit theirs
    table = dialog.table
    for column in range(table.columnCount() - 1):
        widest = max(table.sizeHintForColumn(column), 0)
        assert table.columnWidth(column) >= widest
    tree = dialog.modules
    group = tree.topLevelItem(0)
    group.setExpanded(True)
    names = [group.text(0)] + [group.child(i).text(0) for i in range(group.childCount())]
    longest = max(tree.fontMetrics().horizontalAdvance(name) for name in names)
    assert tree.header().sectionSize(0) >= longest + 2 * tree.indentation()
    for column in (1, 2):
        assert tree.header().sectionSize(column) >= tree.sizeHintForColumn(column)


def test_the_weights_dtype_replans_with_the_model_counted_in_it(qtbot, llama_8b):
    dialog = _dialog(qtbot, llama_8b, "2x8-h100-80gb")
    bf16_total = dialog.layout_model.total_nbytes
    assert dialog.plan.weight_dtype == "bfloat16"
    dialog.dtype_combo.setCurrentText("float8_e4m3fn")
    # every weight of Llama 3.1 8B takes 1 byte instead of 2; the two rotary buffers
    # (inv_freq, original_inv_freq: 64 fp32 elements, 256 B each as stored) count 64 B in fp8
    fp8_total = dialog.layout_model.total_nbytes
    assert bf16_total - 2 * 256 == 2 * (fp8_total - 2 * 64)
    assert dialog.plan.weight_dtype == "float8_e4m3fn"
    assert "float8_e4m3fn" in dialog.trace_view.toPlainText()
    dialog.dtype_combo.setCurrentText("as stored")
    assert dialog.layout_model.total_nbytes == bf16_total


def test_the_lanes_paint_the_stage_colours(qtbot, llama_8b):
    dialog = _dialog(qtbot, llama_8b, "4x1-rtx4090-10gbe", engine="llama.cpp")
    lanes = dialog.lanes_widget
    lanes.resize(lanes.sizeHint())
    image = QImage(lanes.size(), QImage.Format.Format_ARGB32)
    image.fill(0)
    lanes.render(image)
    node, gpu, rect = lanes.lanes()[0]
    stage = lanes.stage_of(node, gpu)
    pixel = image.pixelColor(int(rect.x()) + 3, int(rect.center().y()))
    assert pixel.rgb() == stage_color(stage.index).rgb()


def test_export_launch_scripts_from_the_view(qtbot, llama_8b, tmp_path: Path):
    dialog = _dialog(qtbot, llama_8b, "2x8-h100-80gb")
    assert dialog.export_button.isEnabled()
    written = dialog.export_scripts(tmp_path / "launch")
    assert written and all(path.exists() for path in written)
    script = next(path for path in written if path.suffix == ".sh")
    assert os.access(script, os.X_OK)
    assert "vllm serve meta-llama/Llama-3.1-8B" in script.read_text()
    assert dialog.status_label.text().startswith(f"Wrote {len(written)} files")


def test_a_failed_export_is_shown_not_raised(qtbot, llama_8b, tmp_path: Path):
    dialog = _dialog(qtbot, llama_8b, "2x8-h100-80gb")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert dialog.export_scripts(blocker / "launch") == []
    assert dialog.status_label.text().startswith("Export failed")


def test_tools_menu_opens_the_cluster_view(qtbot, main_window):
    action = main_window.actions_by_name["cluster_plan"]
    assert action.text() == "C&luster plan…"
    assert show_cluster_plan(main_window) is None  # no model yet: a status message instead
    assert "Open a model first" in main_window.statusBar().currentMessage()
