"""Pipeline stages as colour bands on the main module tree: which rows get which stage, the
painted band and legend, clearing by the legend's button or another model, and the cluster
view driving them in the real window."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QImage

from workbench.gui.colors import stage_color
from workbench.gui.stage_bands import (
    BAND_PX,
    StageBands,
    StageLegend,
    install_stage_bands,
    module_stages,
)
from workbench.gui.tree_model import NAME_COLUMN, ModuleTreeModel
from workbench.gui.tree_view import ModuleTreePanel
from workbench.models.cluster import load_cluster
from workbench.models.intake import open_model
from workbench.runtime.cluster_layout import ModelLayout
from workbench.runtime.cluster_plan import plan_cluster

pytestmark = pytest.mark.gui


@pytest.fixture(scope="module")
def llama_8b():
    return open_model("llama-3.1-8b")


@pytest.fixture(scope="module")
def pp4_candidate(llama_8b):
    # 16 GB of bf16 weights over 4 x 24 GB RTX 4090s: llama.cpp splits by layers, TP 1
    plan = plan_cluster(
        ModelLayout.from_opened(llama_8b),
        load_cluster("4x1-rtx4090-10gbe"),
        engine="llama.cpp",
        context_tokens=8192,
    )
    return next(c for c in plan.candidates if c.pp == 4)


def test_module_stages_gives_ancestors_every_stage_below_them():
    stages = module_stages(
        [
            (0, ("model.embed_tokens", "model.layers.0")),
            (1, ("model.layers.1", "model.norm", "lm_head")),
        ]
    )
    assert stages["model.layers.0"] == (0,)
    assert stages["model.layers"] == (0, 1)
    assert stages["model"] == (0, 1)
    assert stages[""] == (0, 1)
    assert stages["lm_head"] == (1,)
    assert "model.layers.0.mlp" not in stages  # descendants are looked up by walking up


def test_rows_take_their_block_stage_and_parents_spanning_stages_get_stripes(pp4_candidate):
    bands = StageBands()
    assert bands.stages_of("model.layers.0") == ()  # nothing before a plan
    bands.set_candidate(pp4_candidate, "4x1-rtx4090-10gbe")
    first, last = pp4_candidate.stages[0], pp4_candidate.stages[-1]
    assert bands.stages_of("model.embed_tokens") == (0,)
    assert bands.stages_of("model.layers.0.self_attn.q_proj") == (0,)  # inherits its block
    assert bands.stages_of(f"model.layers.{last.first_layer}.mlp") == (last.index,)
    assert bands.stages_of("lm_head") == (last.index,)
    assert bands.stages_of("model.layers") == (0, 1, 2, 3)
    assert bands.label == "TP1 x PP4 on 4x1-rtx4090-10gbe"
    assert bands.legend[0] == (0, f"{first.node_name} GPU 0, layers 0-{first.layer_count - 1}")


def _panel(qtbot, opened):
    model = ModuleTreeModel()
    panel = ModuleTreePanel(model)
    qtbot.addWidget(panel)
    model.set_tree(opened.tree, {"": "cpu"})
    panel.resize(700, 500)
    panel.show()
    qtbot.waitExposed(panel)
    return model, panel


def _band_pixel(panel, name: str):
    index = panel.proxy.mapFromSource(panel.model.index_of(name, NAME_COLUMN))
    rect = panel.view.visualRect(index)
    assert rect.isValid(), f"{name} is not in view"
    viewport = panel.view.viewport()
    image = QImage(viewport.size(), QImage.Format.Format_ARGB32)
    image.fill(0)
    viewport.render(image)
    return image.pixelColor(rect.left() + 1 + BAND_PX // 2, rect.center().y())


def test_the_tree_paints_each_row_in_its_stage_colour_with_a_legend(qtbot, llama_8b, pp4_candidate):
    _, panel = _panel(qtbot, llama_8b)
    bands = install_stage_bands(panel)
    assert install_stage_bands(panel) is bands  # fitted once
    legend = panel.findChild(StageLegend, "stageLegend")
    assert legend is not None and not legend.isVisible()
    before = _band_pixel(panel, "lm_head")
    bands.set_candidate(pp4_candidate, "4x1-rtx4090-10gbe")
    qtbot.waitUntil(legend.isVisible)
    last = pp4_candidate.stages[-1].index
    assert _band_pixel(panel, "lm_head").rgb() == stage_color(last).rgb() != before.rgb()
    assert _band_pixel(panel, "model.embed_tokens").rgb() == stage_color(0).rgb()
    assert "stage 3" in legend.text.text() and "TP1 x PP4" in legend.text.text()
    # Clear removes the bands and hides the legend
    legend.clear_button.click()
    assert not bands.active and not legend.isVisible()
    assert _band_pixel(panel, "lm_head").rgb() == before.rgb()


def test_another_model_clears_the_bands(qtbot, llama_8b, pp4_candidate):
    model, panel = _panel(qtbot, llama_8b)
    bands = install_stage_bands(panel)
    bands.set_candidate(pp4_candidate)
    assert bands.active
    model.set_tree(open_model("tiny-llama-demo").tree, {"": "cpu"})
    assert not bands.active and bands.stages_of("lm_head") == ()


def test_the_cluster_view_bands_the_main_tree_and_follows_its_selection(
    qtbot, main_window, open_in_window
):
    from workbench.gui.cluster_view import show_cluster_plan

    open_in_window(main_window, "llama-3.1-8b")
    dialog = show_cluster_plan(main_window)
    assert dialog is not None
    qtbot.addWidget(dialog)
    bands = main_window.tree_panel.findChild(StageBands, "stageBands")
    best = dialog.selected_candidate()
    assert bands.active and bands.label.startswith(best.label)
    other_row = next(r for r, c in enumerate(dialog.plan.candidates) if c.pp != best.pp)
    dialog.table.selectRow(other_row)
    other = dialog.plan.candidates[other_row]
    assert bands.label.startswith(other.label)
    assert bands.stages_of("lm_head") == (other.stages[-1].index,)
    dialog.close()
    assert bands.active  # the plan stays on the tree after the dialog closes
    open_in_window(main_window, "tiny-llama-demo")
    assert not bands.active
