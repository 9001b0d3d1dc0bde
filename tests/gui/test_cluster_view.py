"""The cluster view: candidates side by side, nodes as device lanes coloured by stage, the
module list banded by stage, export of launch scripts, and the Tools menu entry."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from workbench.gui.cluster_view import ClusterPlanDialog, show_cluster_plan, stage_color
from workbench.models.intake import open_model

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
    # modules carry their stage's colour band: embeddings on the first, lm_head on the last
    items = [dialog.modules.topLevelItem(i) for i in range(dialog.modules.topLevelItemCount())]
    names = [item.text(0) for item in items]
    assert names[0] == "model.embed_tokens" and names[-1] == "lm_head"
    last = best.stages[-1].index
    assert items[-1].background(1).color() == stage_color(last)
    # picking another candidate redraws
    other = next(row for row, c in enumerate(dialog.plan.candidates) if c is not best)
    dialog.table.selectRow(other)
    assert dialog.lanes_widget.candidate is dialog.plan.candidates[other]


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
