"""The live plots on their own: real widgets fed plain numbers, exported to real files."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QImage

from workbench.big_modeling.transfers import TransferEvent
from workbench.gui.plots import GIB, PlotControls, group_layer_timings, summarize_layers
from workbench.gui.plots.memory_plot import _TAIL_PX, MemoryPlot, SampleRing
from workbench.gui.plots.transfer_plot import TransferPlot
from workbench.runtime.protocol import LayerTiming

pytestmark = pytest.mark.gui


def _png_ok(path) -> bool:
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and not QImage(str(path)).isNull()


# -- SampleRing ----------------------------------------------------------------------------


def test_sample_ring_keeps_newest_rows_contiguous_in_order() -> None:
    ring = SampleRing(4)
    for i in range(11):  # wraps the 8-row storage once: 11 = 8 + 3
        ring.append(float(i), {"a": 10.0 * i})
    t_s, values = ring.view()
    assert t_s.tolist() == [7.0, 8.0, 9.0, 10.0]
    assert values[:, 0].tolist() == [70.0, 80.0, 90.0, 100.0]


def test_sample_ring_new_series_reads_nan_before_it_appeared() -> None:
    ring = SampleRing(10)
    ring.append(0.0, {"a": 1.0})
    ring.append(1.0, {"a": 2.0, "b": 5.0})
    _, values = ring.view()
    assert ring.names == ["a", "b"]
    assert np.isnan(values[0, 1]) and values[1, 1] == 5.0


# -- MemoryPlot ----------------------------------------------------------------------------


@pytest.fixture
def memory_plot(qtbot):
    plot = MemoryPlot()
    qtbot.addWidget(plot)
    plot.resize(800, 400)
    plot.show()
    qtbot.waitExposed(plot)
    return plot


def test_memory_plot_draws_samples_in_gib(qtbot, memory_plot: MemoryPlot) -> None:
    for k in range(5):
        memory_plot.append_sample(
            100.0 + k, {"worker rss": (k + 1) * GIB, "cuda:0 allocated": 2 * GIB}
        )
    qtbot.waitUntil(lambda: memory_plot.refresh_count > 0, timeout=2000)
    x, y = memory_plot.drawn_data("worker rss")
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]  # relative to the first sample
    assert y.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert memory_plot.series_names == ["worker rss", "cuda:0 allocated"]


def test_memory_plot_keeps_refreshing_while_fed(qtbot, memory_plot: MemoryPlot) -> None:
    """The rate (>= 10 Hz) is measured by ``benchmarks/bench_plots.py``."""
    clock = {"t_s": 0.0}

    def feed() -> None:
        clock["t_s"] += 0.02
        memory_plot.append_sample(clock["t_s"], {"worker rss": GIB * (1 + clock["t_s"])})

    feeder = QTimer()
    feeder.setInterval(20)  # 50 samples/s
    feeder.timeout.connect(feed)
    feeder.start()
    start_count = memory_plot.refresh_count
    qtbot.waitUntil(lambda: memory_plot.refresh_count - start_count >= 10, timeout=30_000)
    feeder.stop()
    x, _ = memory_plot.drawn_data("worker rss")
    assert len(x) > 1 and x[-1] > 0  # what is drawn is what was fed, not the first sample


def test_memory_plot_keeps_near_budget_lines_in_view(qtbot, memory_plot: MemoryPlot) -> None:
    memory_plot.set_budgets({0: 24 * GIB, "cpu": 16 * GIB})
    for k in range(5):  # the worker's lines peak at 12 GiB, under both budgets
        memory_plot.append_sample(
            float(k), {"worker rss": GIB, "cuda:0 allocated": 12 * GIB, "system available": 9 * GIB}
        )
    memory_plot.refresh()
    _, (y_min, y_max) = memory_plot.plot_widget.getPlotItem().getViewBox().viewRange()
    assert set(memory_plot._budget_lines) == {"cuda:0", "cpu"}
    for line in memory_plot._budget_lines.values():
        assert y_min <= line.value() < y_max
    assert memory_plot.off_scale == {} and memory_plot.off_scale_label.text() == ""
    memory_plot.set_budgets({"cpu": 30 * GIB})  # a new, larger budget: the range follows
    memory_plot.refresh()
    assert memory_plot.plot_widget.getPlotItem().getViewBox().viewRange()[1][1] > 30


def test_memory_plot_scales_to_the_data_and_marks_far_lines_off_scale(
    qtbot, memory_plot: MemoryPlot
) -> None:
    """Issue 14 item 16: a 300 MiB worker under a 22 GiB budget was a flat line at the floor."""
    memory_plot.set_budgets({"cpu": 22.2 * GIB})
    for k in range(5):
        memory_plot.append_sample(
            float(k), {"worker rss": (0.25 + 0.01 * k) * GIB, "system available": 20.9 * GIB}
        )
    memory_plot.refresh()
    view_box = memory_plot.plot_widget.getPlotItem().getViewBox()
    y_max = view_box.viewRange()[1][1]
    assert 0.29 < y_max <= 0.5  # the rss line (0.25-0.29 GiB) fills most of the height
    assert memory_plot.off_scale == pytest.approx({"cpu budget": 22.2, "system available": 20.9})
    text = memory_plot.off_scale_label.text()
    assert (
        "off scale" in text
        and "cpu budget 22.2 GiB" in text
        and "system available 20.9 GiB" in text
    )
    assert memory_plot.off_scale_label.isVisible()
    # the worker grows to 10 GiB: both lines come within reach and are drawn on the scale
    memory_plot.append_sample(5.0, {"worker rss": 10 * GIB, "system available": 11 * GIB})
    memory_plot.refresh()
    assert view_box.viewRange()[1][1] > 22.2
    assert memory_plot.off_scale == {} and memory_plot.off_scale_label.text() == ""


def test_hiding_a_series_refits_y_to_the_shown_ones(qtbot, memory_plot: MemoryPlot) -> None:
    memory_plot.set_budgets({"cpu": 2 * GIB})
    for k in range(5):
        memory_plot.append_sample(float(k), {"worker rss": GIB, "cuda:0 reserved": 20 * GIB})
    memory_plot.refresh()
    view_box = memory_plot.plot_widget.getPlotItem().getViewBox()
    assert view_box.viewRange()[1][1] >= 20
    memory_plot.set_series_visible("cuda:0 reserved", False)
    qtbot.waitUntil(lambda: view_box.viewRange()[1][1] < 5, timeout=2000)  # rss and budget
    assert view_box.viewRange()[1][1] > 2
    memory_plot.set_series_visible("cuda:0 reserved", True)
    qtbot.waitUntil(lambda: view_box.viewRange()[1][1] >= 20, timeout=2000)


def test_memory_plot_redraws_only_when_a_pixel_would_change(qtbot, memory_plot) -> None:
    for k in range(600):  # 60 s at 10 samples/s on a 0..80 s axis: ~0.1 s per pixel
        memory_plot.append_sample(k / 10, {"worker rss": GIB})
    memory_plot.refresh()
    full, count = memory_plot.full_redraw_count, memory_plot.refresh_count
    s_per_px, gib_per_px = memory_plot.plot_widget.getPlotItem().getViewBox().viewPixelSize()
    last_s = 59.9
    memory_plot.append_sample(last_s + s_per_px / 4, {"worker rss": GIB + 0.1 * gib_per_px * GIB})
    assert not memory_plot.would_change_view()  # a quarter pixel right, a tenth of one up
    qtbot.waitUntil(lambda: memory_plot.skipped_count > 0, timeout=2000)
    assert memory_plot.refresh_count == count
    memory_plot.append_sample(last_s + s_per_px / 2, {"worker rss": GIB + 3 * gib_per_px * GIB})
    assert memory_plot.would_change_view()  # three pixels up
    qtbot.waitUntil(lambda: memory_plot.refresh_count > count, timeout=2000)
    assert memory_plot.full_redraw_count == full  # only the tail was redrawn
    x, y = memory_plot.drawn_data("worker rss")
    assert len(x) == 602 and y[-1] == pytest.approx(1 + 3 * gib_per_px)
    memory_plot.append_sample(last_s + 1.1 * _TAIL_PX * s_per_px, {"worker rss": GIB})
    memory_plot.refresh()  # a tail wider than _TAIL_PX pixels folds into the body
    assert memory_plot.full_redraw_count == full + 1
    assert len(memory_plot.curve("worker rss").getOriginalDataset()[0]) >= 603


def test_memory_plot_budgets_markers_and_csv(tmp_path, qtbot, memory_plot: MemoryPlot) -> None:
    memory_plot.set_budgets({0: 8 * GIB, "cpu": 16 * GIB, "disk": 10**12})
    memory_plot.append_sample(5.0, {"worker rss": 1024})
    memory_plot.add_marker(5.5, "load start")
    memory_plot.append_sample(6.0, {"worker rss": 2048, "system available": 4096})
    assert sorted(memory_plot._budget_lines) == ["cpu", "cuda:0"]  # disk has no RAM budget
    assert memory_plot._budget_lines["cuda:0"].value() == 8.0
    assert memory_plot.marker_labels == ["load start"]
    out = memory_plot.export_csv(tmp_path / "memory.csv")
    rows = list(csv.reader(io.StringIO(out.read_text())))
    assert rows[0] == ["t_s", "worker rss (bytes)", "system available (bytes)", "marker"]
    assert rows[1:] == [  # in time order, every row as wide as the header
        ["0.000", "1024", "", ""],
        ["0.500", "", "", "load start"],
        ["1.000", "2048", "4096", ""],
    ]


def test_markers_close_in_time_put_their_labels_on_alternate_rows(
    qtbot, memory_plot: MemoryPlot
) -> None:
    memory_plot.append_sample(0.0, {"worker rss": 1024})
    for t_s, label in [(1.0, "load start"), (1.1, "load end"), (1.2, "infer #1")]:
        memory_plot.add_marker(t_s, label)
    rows = [line.label.orthoPos for _, _, line in memory_plot._markers]
    assert rows[0] != rows[1] and rows[1] != rows[2]  # neighbours never share a row
    assert abs(rows[0] - rows[1]) >= 0.4  # two rows well apart on the line
    memory_plot.reset()
    memory_plot.append_sample(0.0, {"worker rss": 1024})
    memory_plot.add_marker(1.0, "load start")
    assert memory_plot._markers[0][2].label.orthoPos == rows[0]  # a reset starts over


def test_a_marker_before_the_first_sample_is_in_view(qtbot, memory_plot: MemoryPlot) -> None:
    memory_plot.add_marker(100.0, "load start")  # the load starts before telemetry arrives
    memory_plot.refresh()
    (x0, x1), _ = memory_plot.plot_widget.getPlotItem().getViewBox().viewRange()
    assert x0 < 0.0 < x1  # shown already, off the left axis
    memory_plot.append_sample(103.0, {"worker rss": GIB})
    memory_plot.append_sample(104.0, {"worker rss": GIB})
    memory_plot.refresh()
    (x0, x1), _ = memory_plot.plot_widget.getPlotItem().getViewBox().viewRange()
    assert x0 < 0.0 and x1 >= 4.0  # the marker (x 0) and the samples (x 3..4) both show


def test_budget_label_never_overlaps_a_marker_label(qtbot, memory_plot: MemoryPlot) -> None:
    memory_plot.set_budgets({"cpu": 8 * GIB})  # y range 0-10 GiB: the line at 80% height
    for k in range(41):
        memory_plot.append_sample(float(k), {"worker rss": 3 * GIB})  # 8 < 3 x 3: on the scale
    labels = ["load start", "load end", "infer #1", "infer #2", "verify #3", "unload"]
    for t_s, label in zip([1.0, 3.0, 12.0, 13.0, 22.0, 30.0], labels, strict=True):
        memory_plot.add_marker(t_s, label)  # one near 30% of the width, where the label was
    memory_plot.refresh()
    budget = memory_plot._budget_lines["cpu"].label
    view_box = memory_plot.plot_widget.getPlotItem().getViewBox()

    def budget_label_placed() -> bool:  # labels follow the new view on the next event pass
        rect = budget.mapRectToScene(budget.boundingRect())
        return view_box.sceneBoundingRect().contains(rect)

    qtbot.waitUntil(budget_label_placed, timeout=5000)
    budget_rect = budget.mapRectToScene(budget.boundingRect())
    for _, label, line in memory_plot._markers:
        marker_rect = line.label.mapRectToScene(line.label.boundingRect())
        assert not budget_rect.intersects(marker_rect), label
    legend = memory_plot.plot_widget.getPlotItem().legend
    assert not budget_rect.intersects(legend.sceneBoundingRect())


def test_file_backed_series_is_a_dashed_worker_line_and_the_last_csv_column(
    tmp_path, qtbot, memory_plot: MemoryPlot
) -> None:
    for k in range(4):
        memory_plot.append_sample(
            10.0 + k,
            {
                "worker rss": (3 + k) * GIB,
                "system available": 20 * GIB,
                "worker file-backed": (k + 1) * GIB // 2,
            },
        )
    memory_plot.append_sample(14.0, {"worker rss": 7 * GIB, "cuda:0 allocated": GIB})  # late GPU
    memory_plot.refresh()
    x, y = memory_plot.drawn_data("worker file-backed")
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert y[:4].tolist() == [0.5, 1.0, 1.5, 2.0] and np.isnan(y[4])  # GiB; a gap at the end
    assert memory_plot.latest("worker file-backed") is None  # the GPU-only sample lacks it
    rss_pen = memory_plot.curve("worker rss").opts["pen"]
    file_pen = memory_plot.curve("worker file-backed").opts["pen"]
    assert file_pen.style() == Qt.PenStyle.DashLine and rss_pen.style() == Qt.PenStyle.SolidLine
    assert file_pen.color() == rss_pen.color()  # the worker's colour
    legend = memory_plot.plot_widget.getPlotItem().legend
    label = legend.getLabel(memory_plot.curve("worker file-backed")).text
    assert label == "worker file-backed (part of rss, reclaimable)"
    assert legend.getLabel(memory_plot.curve("worker rss")).text == "worker rss"

    rows = list(csv.reader(io.StringIO(memory_plot.export_csv(tmp_path / "m.csv").read_text())))
    assert rows[0] == [
        "t_s",
        "worker rss (bytes)",
        "system available (bytes)",
        "cuda:0 allocated (bytes)",
        "worker file-backed (bytes)",  # last of the series, though it came before CUDA
        "marker",
    ]
    gib = int(GIB)
    assert rows[1] == ["0.000", str(3 * gib), str(20 * gib), "", str(gib // 2), ""]
    assert rows[5] == ["4.000", str(7 * gib), "", str(gib), "", ""]


def test_memory_plot_pause_freezes_display_and_resume_catches_up(qtbot, memory_plot) -> None:
    memory_plot.append_sample(0.0, {"worker rss": GIB})
    qtbot.waitUntil(lambda: memory_plot.refresh_count > 0, timeout=2000)
    memory_plot.controls.pause_button.click()
    assert memory_plot.paused and memory_plot.controls.pause_button.text() == "Resume"
    memory_plot.append_sample(1.0, {"worker rss": 2 * GIB})
    count = memory_plot.refresh_count
    qtbot.wait(300)  # three timer periods with nothing drawn
    assert memory_plot.refresh_count == count
    assert len(memory_plot.drawn_data("worker rss")[0]) == 1
    memory_plot.controls.pause_button.click()
    qtbot.waitUntil(lambda: len(memory_plot.drawn_data("worker rss")[0]) == 2)


def test_memory_plot_reset_forgets_samples(qtbot, memory_plot: MemoryPlot) -> None:
    memory_plot.append_sample(0.0, {"worker rss": GIB})
    memory_plot.add_marker(0.0, "x")
    memory_plot.controls.reset_button.click()
    assert memory_plot.sample_count == 0 and memory_plot.marker_labels == []
    assert memory_plot.to_csv().strip() == "t_s,worker rss (bytes),marker"


def test_export_buttons_write_png_and_csv(tmp_path, qtbot, memory_plot: MemoryPlot) -> None:
    memory_plot.append_sample(0.0, {"worker rss": GIB})
    memory_plot.refresh()
    answers = iter([str(tmp_path / "m.png"), str(tmp_path / "m.csv"), None])
    memory_plot.controls.path_chooser = lambda title, filt: next(answers)
    memory_plot.controls.png_button.click()
    memory_plot.controls.csv_button.click()
    memory_plot.controls.csv_button.click()  # the user cancels the dialog: nothing happens
    assert _png_ok(tmp_path / "m.png")
    assert (tmp_path / "m.csv").read_text().startswith("t_s,")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv", "m.png"]  # no temp files left


def test_export_write_errors_are_shown_in_a_message_box(tmp_path, qtbot, memory_plot) -> None:
    memory_plot.append_sample(0.0, {"worker rss": GIB})
    memory_plot.refresh()
    controls = memory_plot.controls
    for button, name in ((controls.csv_button, "m.csv"), (controls.png_button, "m.png")):
        target = tmp_path / "no-such-folder" / name
        controls.path_chooser = lambda title, filt, target=target: str(target)
        button.click()
        box = controls.last_error_box
        assert box is not None and box.isVisible() and not box.isModal()
        assert box.windowTitle() == "Export failed" and str(target) in box.text()
        box.close()
    assert list(tmp_path.iterdir()) == []


# -- TransferPlot --------------------------------------------------------------------------


def _forward(scale: float = 1.0) -> list[LayerTiming]:
    return [
        LayerTiming("model.embed", 0.0, 0.001 * scale, 0, ""),
        LayerTiming("model.layers.0", 0.004 * scale, 0.002 * scale, 8_000_000, "cpu"),
        LayerTiming("model.layers.1", 0.010 * scale, 0.002 * scale, 8_000_000, "disk"),
    ]


@pytest.fixture
def transfer_plot(qtbot):
    plot = TransferPlot(max_steps=4)
    qtbot.addWidget(plot)
    plot.resize(900, 450)
    plot.show()
    qtbot.waitExposed(plot)
    return plot


def test_transfer_plot_stacks_transfer_under_compute_by_tier(qtbot, transfer_plot) -> None:
    transfer_plot.add_forward(_forward())
    qtbot.waitUntil(lambda: transfer_plot.refresh_count > 0, timeout=2000)  # the 10 Hz timer
    cpu_bars = transfer_plot._tier_bars["cpu"].opts
    disk_bars = transfer_plot._tier_bars["disk"].opts
    assert list(cpu_bars["x"]) == [1.0] and list(cpu_bars["height"]) == pytest.approx([4.0])
    assert list(disk_bars["x"]) == [2.0] and list(disk_bars["height"]) == pytest.approx([10.0])
    compute = transfer_plot.compute_bars.opts
    assert list(compute["y0"]) == pytest.approx([0.0, 4.0, 10.0])  # compute sits on transfer
    assert list(compute["height"]) == pytest.approx([1.0, 2.0, 2.0])
    x, y = transfer_plot.bw_points.getData()
    assert list(x) == [1.0, 2.0] and list(y) == pytest.approx([2.0, 0.8])  # 8 MB / 4 ms


def test_transfer_plot_heatmap_rolls_after_max_steps(transfer_plot: TransferPlot) -> None:
    for step in range(6):
        transfer_plot.add_forward(_forward(scale=step + 1))
    heat = transfer_plot.heatmap()
    assert heat.shape == (4, 3)  # max_steps=4 columns kept, 3 layers
    assert heat[:, 2].tolist() == pytest.approx([36.0, 48.0, 60.0, 72.0])  # 12 ms x steps 3..6
    transfer_plot.refresh()
    assert transfer_plot.heat_image.image.shape == (4, 3)


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_a_heat_map_few_steps_wide_has_rows_of_whole_words(
    transfer_plot: TransferPlot, steps: int
) -> None:
    # one byte a step: 1-3 steps made QImage rows of 1-3 bytes, which Qt read past (segfault)
    for step in range(steps):
        transfer_plot.add_forward(_forward(scale=step + 1))
    transfer_plot.refresh()
    image = transfer_plot.heat_image.image
    assert image.shape[0] % 4 == 0 and image.shape[1] == 3
    repeat = image.shape[0] // steps
    assert image[::repeat].tolist() == transfer_plot.heatmap().tolist()  # each step, repeated
    rect = transfer_plot.heat_image.boundingRect()
    mapped = transfer_plot.heat_image.mapRectToParent(rect)
    assert (mapped.width(), mapped.height()) == pytest.approx((steps, 3))  # the same rectangle


def test_transfer_plot_hover_names_module_bytes_and_bandwidth(transfer_plot) -> None:
    transfer_plot.add_forward(_forward())
    transfer_plot.set_prediction({"model.layers.1": 0.011})
    text = transfer_plot.hover_text_at(2.1, 5.0)
    assert "model.layers.1" in text and "7.63 MiB" in text and "0.8 GB/s" in text
    assert "from disk" in text and "predicted 11.00 ms" in text
    assert transfer_plot.hover_text_at(2.5, 5.0) == ""  # between bars
    assert transfer_plot.hover_text_at(2.0, 50.0) == ""  # above the bar


def test_transfer_plot_prediction_and_peak_lines(transfer_plot: TransferPlot) -> None:
    transfer_plot.add_forward(_forward())
    transfer_plot.set_prediction({"model.layers.0": 0.005, "model.layers.1": 0.02})
    transfer_plot.refresh()
    x, y = transfer_plot.predicted_curve.getOriginalDataset()
    assert list(x) == [-0.5, 0.5, 1.5, 2.5] and list(y) == pytest.approx([0.0, 5.0, 20.0])
    transfer_plot.set_peak_bandwidth({"cpu": 25.0, "disk": 3.0, "gpu": 0})
    assert sorted(line.value() for line in transfer_plot._peak_lines) == [3.0, 25.0]


def test_transfer_plot_draws_transfer_time_at_link_peak_and_marks_overlap(
    qtbot, transfer_plot: TransferPlot
) -> None:
    transfer_plot.set_peak_bandwidth({"cpu": 1.0, "disk": 2.0})
    transfer_plot.add_forward(_forward())  # cpu: 8 MB in 4 ms (2 GB/s); disk: 8 MB in 10 ms
    transfer_plot.refresh()
    x, y = transfer_plot.at_peak_curve.getOriginalDataset()
    assert list(x) == [-0.5, 0.5, 1.5, 2.5]
    assert np.isnan(y[0]) and list(y[1:]) == pytest.approx([8.0, 4.0])  # bytes / peak, in ms
    over_x, over_y = transfer_plot.overlap_points.getData()
    assert list(over_x) == [1.0] and list(over_y) == pytest.approx([6.0])  # only cpu beat 1 GB/s
    text = transfer_plot.hover_text_at(1.0, 3.0)
    assert "at the cpu link peak (1.0 GB/s): 8.00 ms" in text and "overlapped by prefetch" in text
    assert "overlapped" not in transfer_plot.hover_text_at(2.0, 3.0)
    transfer_plot.set_peak_bandwidth({})
    transfer_plot.refresh()
    assert len(transfer_plot.overlap_points.getData()[0]) == 0
    assert transfer_plot.at_peak_curve.getOriginalDataset()[0] is None


def test_transfer_plot_heatmap_keeps_every_layer_of_a_deep_model(transfer_plot) -> None:
    """The cost per forward (linear in the layers) is measured by ``benchmarks/bench_plots.py``."""
    plot = TransferPlot(max_steps=64)
    names = [f"model.layers.{i}" for i in range(3000)]
    plot.set_layers(names)
    for step in range(70):  # more forwards than steps kept: the oldest leave
        plot.add_forward(
            [LayerTiming(name, 1e-3 * (step + 1), 1e-3, 10**6, "disk") for name in names]
        )
    heat = plot.heatmap()
    assert heat.shape == (64, 3000)
    # ms of transfer + compute: step k took k + 2; the newest last, the first six gone
    assert heat[-1].tolist() == pytest.approx([71.0] * 3000)
    assert heat[0].tolist() == pytest.approx([8.0] * 3000)
    plot.deleteLater()


def test_transfer_plot_is_readable_in_a_low_dock(qtbot) -> None:
    plot = TransferPlot(max_steps=8)
    qtbot.addWidget(plot)
    plot.resize(1600, 230)  # the Runtime dock's default height
    plot.show()
    qtbot.waitExposed(plot)
    for k in range(3):
        plot.add_forward(_forward(1.0 + k))
    plot.refresh()
    bars = plot.bar_plot.getViewBox().sceneBoundingRect()
    assert bars.height() >= 80, bars  # was about 40 px under a legend
    legend = plot.legend.sceneBoundingRect()
    assert legend.height() > 0 and not legend.intersects(bars)
    assert plot.legend.columnCount >= 4  # one compact row
    names = [label.text for _, label in plot.legend.items]
    assert names[:4] == ["compute", "predicted", "transfer at link peak", "overlapped by prefetch"]
    assert {"from cpu", "from disk"} <= set(names)


def test_heatmap_has_a_colour_scale_in_ms_and_hover_text(transfer_plot: TransferPlot) -> None:
    for k in range(3):
        transfer_plot.add_forward(_forward(1.0 + k))
    transfer_plot.refresh()
    top = float(transfer_plot.heatmap().max())
    assert top == pytest.approx(36.0)  # (10 + 2) ms * 3
    assert transfer_plot.heat_colorbar.levels() == pytest.approx((0.0, top))
    assert tuple(transfer_plot.heat_image.getLevels()) == pytest.approx((0.0, top))
    assert transfer_plot.heat_colorbar.getAxis("left").labelText == "ms"
    text = transfer_plot.heat_hover_text_at(2.5, 2.5)  # step 2, layer 2
    assert text == "forward step 2\nlayer 2: model.layers.1\n36.00 ms (transfer + compute)"
    assert transfer_plot.heat_hover_text_at(3.5, 0.5) == ""  # no fourth step yet
    assert transfer_plot.heat_hover_text_at(0.5, 3.5) == ""  # no fourth layer


def test_transfer_hover_shows_small_transfers_in_kib_with_a_real_rate(transfer_plot) -> None:
    transfer_plot.add_forward([LayerTiming("model.norm", 0.00014, 0.00001, 512, "disk")])
    text = transfer_plot.hover_text_at(0.0, 0.1)
    assert "0.14 ms from disk, 512 B at 3.66 MB/s" in text, text
    assert "0.0 MiB" not in text and "0.00 GB/s" not in text


def test_transfer_plot_csv_png_and_reset(tmp_path, transfer_plot: TransferPlot) -> None:
    transfer_plot.add_forward(_forward())
    transfer_plot.add_forward(_forward(2.0))
    transfer_plot.refresh()
    rows = list(
        csv.DictReader(io.StringIO(transfer_plot.export_csv(tmp_path / "t.csv").read_text()))
    )
    assert len(rows) == 6
    assert rows[4]["step"] == "1" and rows[4]["module"] == "model.layers.0"
    assert rows[4]["source"] == "cpu" and float(rows[4]["transfer_s"]) == pytest.approx(0.008)
    assert _png_ok(transfer_plot.export_png(tmp_path / "t.png"))
    transfer_plot.controls.reset_button.click()
    assert transfer_plot.forward_count == 0 and transfer_plot.heatmap().shape == (0, 3)


def test_transfer_plot_pause_keeps_recording(qtbot, transfer_plot: TransferPlot) -> None:
    transfer_plot.add_forward(_forward())
    transfer_plot.refresh()
    transfer_plot.controls.pause_button.click()
    transfer_plot.add_forward(_forward(3.0))
    count = transfer_plot.refresh_count
    assert transfer_plot.timer.isActive()
    qtbot.wait(3 * transfer_plot.timer.interval())  # three ticks with new data: none draws it
    assert transfer_plot.refresh_count == count
    assert list(transfer_plot._tier_bars["disk"].opts["height"]) == pytest.approx([10.0])
    transfer_plot.controls.pause_button.click()
    assert list(transfer_plot._tier_bars["disk"].opts["height"]) == pytest.approx([30.0])
    assert transfer_plot.forward_count == 2


def test_summarize_layers_turns_engine_events_into_rows() -> None:
    events = [
        TransferEvent("l0", 1000, "disk", "cpu", 0.0, 0.5),
        TransferEvent("l0", 0, "cpu", "cpu", 0.5, 0.75, kind="compute"),
        TransferEvent("l1", 0, "cpu", "cpu", 0.75, 1.0, kind="compute"),
    ]
    rows = summarize_layers(events)
    assert [(r.module, r.transfer_s, r.compute_s, r.nbytes, r.source) for r in rows] == [
        ("l0", 0.5, 0.25, 1000, "disk"),
        ("l1", 0.0, 0.25, 0, ""),
    ]


def test_plot_controls_call_the_plot(qtbot) -> None:
    calls: list[object] = []

    class Recorder:
        def reset(self) -> None:
            calls.append("reset")

        def set_paused(self, paused: bool) -> None:
            calls.append(paused)

    controls = PlotControls(Recorder())
    qtbot.addWidget(controls)
    controls.pause_button.click()
    controls.pause_button.click()
    controls.reset_button.click()
    assert calls == [True, False, "reset"]


def test_plot_controls_explain_themselves(qtbot) -> None:
    plot = MemoryPlot()
    qtbot.addWidget(plot)
    controls = plot.controls
    tips = {
        button.text(): button.toolTip()
        for button in (
            controls.pause_button,
            controls.reset_button,
            controls.csv_button,
            controls.png_button,
        )
    }
    assert all(len(tip) > 20 for tip in tips.values()), tips
    assert "CSV" in tips["Export CSV…"] and "PNG" in tips["Export PNG…"]


def test_group_layer_timings_counts_nested_compute_once_and_drops_containers() -> None:
    rows = [
        LayerTiming("", 0.0, 0.100),  # the root's forward: a container, dropped
        LayerTiming("model", 0.0, 0.090),  # a container above the units, dropped
        LayerTiming("model.layers.0", 0.004, 0.010, 1000, "disk"),
        LayerTiming("model.layers.0.attn", 0.0, 0.006),  # inside the unit: not added again
        LayerTiming("model.layers.0.attn.q", 0.001, 0.002, 500, "cpu"),  # its transfer is added
        LayerTiming("lm_head", 0.0, 0.003),  # outside every unit: its own row
    ]
    grouped = group_layer_timings(rows, ["model.embed", "model.layers.0"])
    assert [(r.module, r.source, r.nbytes) for r in grouped] == [
        ("model.layers.0", "disk", 1500),
        ("lm_head", "", 0),
    ]
    assert grouped[0].transfer_s == pytest.approx(0.005)
    assert grouped[0].compute_s == pytest.approx(0.010)  # the shallowest timing inside the unit
    assert [r.module for r in group_layer_timings(rows[2:4], [])] == [
        "model.layers.0",
        "model.layers.0.attn",
    ]
