"""Issue 14 item 16 and the empty heatmap: the runtime dock's first height and plot ranges."""

from __future__ import annotations

from typing import Any

import pytest

from workbench.gui.plots.transfer_plot import TransferPlot
from workbench.runtime.protocol import LayerTiming

pytestmark = pytest.mark.gui


def test_the_first_run_runtime_dock_leaves_the_memory_plot_a_readable_height(
    qtbot: Any, main_window: Any
) -> None:
    main_window.resize(1400, 900)
    main_window._default_dock_sizes()
    plot = main_window.runtime_panels.memory_plot.plot_widget
    # 200 px for the whole dock left ~100 px of plot: a flat line. Now 270 px of dock.
    qtbot.waitUntil(lambda: main_window.bottom_dock.height() >= 260, timeout=5000)
    qtbot.waitUntil(lambda: plot.height() >= 170, timeout=5000)
    assert main_window.centralWidget().height() >= 900 // 2  # the tree and lanes keep half


def test_the_empty_heatmap_spans_one_step_not_minus_500_to_500(qtbot: Any) -> None:
    plot = TransferPlot()
    qtbot.addWidget(plot)
    plot.resize(900, 300)
    plot.show()
    qtbot.waitExposed(plot)
    view_box = plot.heat_plot.getViewBox()
    (x0, x1), (y0, y1) = view_box.viewRange()
    assert (x0, x1, y0, y1) == (0, 1, 0, 1)
    plot.set_layers(["l0", "l1", "l2"])
    plot.refresh()
    assert view_box.viewRange() == [[0, 1], [0, 3]]  # its layers, before any forward
    for _ in range(4):
        plot.add_forward([LayerTiming(f"l{i}", 1e-3, 1e-3, 10**6, "cpu") for i in range(3)])
    plot.refresh()
    assert view_box.viewRange() == [[0, 4], [0, 3]]  # four forward steps of three layers
    plot.clear_layers()
    assert view_box.viewRange() == [[0, 1], [0, 1]]


def test_the_predicted_line_sits_below_the_frame_and_ms_stay_ms(qtbot: Any) -> None:
    """Issue 14: the dashed "predicted" plateau ran along the top edge (clipped), and the axis
    read "time (ms) (x0.001)" for sub-millisecond layers."""
    plot = TransferPlot()
    qtbot.addWidget(plot)
    plot.resize(900, 300)
    plot.show()
    plot.set_prediction({"l0": 2.8e-4, "l1": 2.8e-4}, label="predicted for this machine")
    plot.add_forward([LayerTiming(f"l{i}", 1e-4, 1e-4, 10**6, "cpu") for i in range(2)])
    plot.refresh()
    _, (_, y_max) = plot.bar_plot.getViewBox().viewRange()
    assert y_max >= 0.28 * 1.2  # a fifth of headroom above the plateau at 0.28 ms
    axis = plot.bar_plot.getAxis("left")
    assert axis.labelString().count("x0.001") == 0 and "time (ms)" in axis.labelString()
    names = [label.text for _, label in plot.legend.items]
    assert "predicted for this machine" in names and "predicted" not in names
