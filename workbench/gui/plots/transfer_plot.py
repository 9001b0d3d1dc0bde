"""Per-layer transfer latency: bars for the last forward, a heatmap over the run, bandwidth.

Left: one bar per hooked layer, transfer time (coloured by the tier the weights came from)
stacked under compute time (grey), with the speed model's prediction as a dashed step line and,
per layer, the transfer time at the link's peak bandwidth (bytes / peak GB/s, dotted). A
transfer that took less than that cannot have been a plain copy: prefetch overlapped it with
earlier compute, and a marker above the bar says so.
Middle: achieved GB/s per layer against the link's peak from the hardware profile.
Right: heatmap of time per layer (rows) and forward step (columns), with a colour scale in ms.
The three sit side by side under one compact legend row, so each gets the whole height of a
low dock; hovering a bar or a heatmap cell tells its figures.

Layers are looked up by name in a dict and the heatmap is preallocated (its layer capacity
doubles when unknown modules appear; its steps are a ring), so a forward costs O(layers) and
a timer tick redraws only the parts whose data changed.
"""

from __future__ import annotations

import csv
import html
import io
import math
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, QTimer
from PySide6.QtGui import QCursor, QFontMetrics
from PySide6.QtWidgets import (
    QGraphicsItem,
    QLabel,
    QSizePolicy,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from workbench.gui.plots import (
    LayerTiming,
    PlotControls,
    cache_static_parts,
    device_qcolor,
    save_png,
)
from workbench.runtime import atomic_write_text
from workbench.runtime.formatting import format_bandwidth, format_nbytes
from workbench.runtime.ring_buffer import RingBuffer

_COMPUTE_COLOR = "#b0b0b0"
_PEAK_COLOR = "#6a3d9a"
_BAR_WIDTH = 0.8
_HEADROOM = 1.25  # the bar plot's y range over its tallest bar or line
_OVERLAP_MARGIN = 0.9  # a transfer under 90% of its time at peak counts as overlapped
MIN_PLOT_HEIGHT = 150  # px of plots below the buttons: the bars stay readable in a low dock
_LEGEND_ROW_PX = 22
_TITLE_PX = 18
_TITLE_MIN_PX = 40
_COLORBAR_AXIS_PX = 150  # the colour bar's length its tick labels are chosen for


def _tier(source: str) -> str:
    return source or "resident"


def _heat_ring(steps: int) -> RingBuffer:
    """The heatmap's rows: one per forward, one column per layer (ms), 16 columns to start."""
    return RingBuffer(steps, width=16, dtype=np.float32)


class TransferPlot(QWidget):
    """Per-layer timing of forwards, fed one forward at a time.

    Example:
        >>> plot = TransferPlot()  # doctest: +SKIP
        >>> plot.add_forward([LayerTiming("model.layers.0", 0.002, 0.001, 4_000_000, "cpu")])  # doctest: +SKIP
    """

    def __init__(
        self, parent: QWidget | None = None, *, max_steps: int = 256, refresh_hz: float = 10.0
    ) -> None:
        super().__init__(parent)
        self.max_steps = max(1, int(max_steps))
        self._layers: list[str] = []
        self._index_of: dict[str, int] = {}
        self._history: deque[list[LayerTiming]] = deque(maxlen=self.max_steps)
        self._forwards_seen = 0
        self._predicted_s: dict[str, float] = {}
        self._peaks_gbps: dict[str, float] = {}
        self._paused = False
        self._dirty = False
        self._stale: set[str] = set()  # parts to redraw: "bars", "prediction", "heat"
        self.refresh_count = 0
        self._tier_bars: dict[str, pg.BarGraphItem] = {}
        self._peak_lines: list[pg.InfiniteLine] = []
        self._heat = _heat_ring(self.max_steps)

        self.graphics = pg.GraphicsLayoutWidget(self)
        self.graphics.setBackground("w")
        self.graphics.setMinimumHeight(MIN_PLOT_HEIGHT)
        # one legend row above the plots, outside them, so it never covers a bar
        self.legend = pg.LegendItem(
            labelTextSize="8pt", colCount=6, horSpacing=12, brush=pg.mkBrush(255, 255, 255, 0)
        )
        self.legend.setParentItem(None)
        self.legend.layout.setContentsMargins(2, 0, 2, 0)
        self.legend.setMaximumHeight(_LEGEND_ROW_PX)
        # across all three plots: its width ("predicted for this machine") is shared by all,
        # so it never pushes the heatmap's colour scale past the right edge
        self.graphics.addItem(self.legend, row=0, col=0, colspan=3)
        self.bar_plot = self.graphics.addPlot(row=1, col=0)
        _compact_title(self.bar_plot, "Last forward: time per layer")
        self.bar_plot.setLabel("left", "time (ms)")
        self.bar_plot.setLabel("bottom", "layer index")
        self.bar_plot.getAxis("left").enableAutoSIPrefix(False)  # ms stay ms: no "(x0.001)"
        self.bar_plot.showGrid(y=True, alpha=0.25)
        self.compute_bars = pg.BarGraphItem(
            x=[], height=[], width=_BAR_WIDTH, brush=_COMPUTE_COLOR, name="compute"
        )
        self.bar_plot.addItem(self.compute_bars)
        self.predicted_curve = self.bar_plot.plot(
            [],
            [],
            stepMode="center",
            pen=pg.mkPen("#000000", width=1.5, style=Qt.PenStyle.DashLine),
            name="predicted",
        )
        self.at_peak_curve = self.bar_plot.plot(
            [],
            [],
            stepMode="center",
            connect="finite",
            pen=pg.mkPen(_PEAK_COLOR, width=1.5, style=Qt.PenStyle.DotLine),
            name="transfer at link peak",
        )
        self.overlap_points = pg.ScatterPlotItem(
            symbol="t1",
            size=9,
            pen=None,
            brush=pg.mkBrush(_PEAK_COLOR),
            name="overlapped by prefetch",
        )
        self.bar_plot.addItem(self.overlap_points)
        for sample in (
            self.compute_bars,
            self.predicted_curve,
            self.at_peak_curve,
            self.overlap_points,
        ):
            self.legend.addItem(sample, sample.name())
        self.bw_plot = self.graphics.addPlot(row=1, col=1)
        _compact_title(self.bw_plot, "Bandwidth vs link peak")
        self.bw_plot.setLabel("left", "GB/s")
        self.bw_plot.setLabel("bottom", "layer index")
        self.bw_plot.showGrid(y=True, alpha=0.25)
        self.bw_plot.setXLink(self.bar_plot)
        self.bw_points = pg.ScatterPlotItem(size=7, pen=None)
        self.bw_plot.addItem(self.bw_points)
        self.heat_plot = self.graphics.addPlot(row=1, col=2)
        _compact_title(self.heat_plot, "Time per layer and step")
        self.heat_plot.setLabel("bottom", "forward step")
        self.heat_plot.setLabel("left", "layer index")
        self.heat_image = pg.ImageItem(axisOrder="col-major")
        self.heat_image.setColorMap(pg.colormap.get("viridis"))
        self.heat_plot.addItem(self.heat_image)
        self.heat_colorbar = pg.ColorBarItem(
            values=(0.0, 1.0),
            width=12,
            colorMap=pg.colormap.get("viridis"),
            label="ms",
            interactive=False,
            colorMapMenu=False,
        )
        self.heat_colorbar.setImageItem(self.heat_image, insert_in=self.heat_plot)
        self._colorbar_axis_px = 0  # the colour bar axis's width; grows with its labels
        self._fit_colorbar_axis()
        layout = self.graphics.ci.layout
        for column, stretch in enumerate((3, 2, 3)):
            layout.setColumnStretchFactor(column, stretch)
        layout.setRowFixedHeight(0, _LEGEND_ROW_PX)
        layout.setRowStretchFactor(1, 1)
        self._redraw_heat()  # the empty map's axes: one step, no layers
        self.graphics.scene().sigMouseMoved.connect(self._on_scene_mouse_moved)
        for plot in (self.bar_plot, self.bw_plot, self.heat_plot):
            cache_static_parts(plot)
        self.legend.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)

        self.controls = PlotControls(self, self)
        self.model_note = QLabel("", self.controls)
        self.model_note.setObjectName("transferModelNote")
        # a long model name must not widen the dock: the note takes the room left of the buttons
        self.model_note.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.controls.layout().addWidget(self.model_note, 1)
        self.model_note.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(self.controls)
        layout.addWidget(self.graphics, 1)

        # generation can run at hundreds of forwards/s: draw at most refresh_hz times a second
        self.timer = QTimer(self)
        self.timer.setInterval(max(10, int(1000 / refresh_hz)))
        self.timer.timeout.connect(self._on_timer_timeout)
        self.timer.start()

    # -- data in -------------------------------------------------------------------------
    def set_layers(self, modules: Sequence[str]) -> None:
        """Fix the layer order (row/bar index); unknown modules seen later are appended."""
        new = [name for name in dict.fromkeys(modules) if name not in self._index_of]
        if not new:
            return
        self._reserve(len(self._layers) + len(new))
        for name in new:
            self._index_of[name] = len(self._layers)
            self._layers.append(name)
        self._mark_stale("bars", "prediction", "heat")

    def set_prediction(self, predicted_s: Mapping[str, float], label: str = "predicted") -> None:
        """Show the speed model's predicted time per module (seconds) as a dashed step line,
        named ``label`` in the legend (which hardware it is for: "predicted for this machine")."""
        for sample, text_item in self.legend.items:
            if sample.item is self.predicted_curve and text_item.text != label:
                text_item.setText(label)
        self._predicted_s = {str(k): float(v) for k, v in predicted_s.items()}
        self.set_layers(list(self._predicted_s))
        self._mark_stale("prediction")

    def set_peak_bandwidth(self, peaks_gbps: Mapping[str, float]) -> None:
        """Draw the peak bandwidth (GB/s) of each link, keyed by source tier (``"cpu"``...)."""
        for line in self._peak_lines:
            self.bw_plot.removeItem(line)
        self._peak_lines.clear()
        self._peaks_gbps = {str(k): float(v) for k, v in peaks_gbps.items() if v and v > 0}
        for tier, gbps in sorted(self._peaks_gbps.items()):
            color = device_qcolor(tier)
            line = pg.InfiniteLine(
                pos=gbps,
                angle=0,
                pen=pg.mkPen(color, width=1.5, style=Qt.PenStyle.DashLine),
                label=f"{tier} link peak {gbps:.1f} GB/s",
                labelOpts={"position": 0.98, "color": color, "anchors": [(1, 1), (1, 1)]},
            )
            self.bw_plot.addItem(line)
            self._peak_lines.append(line)
        self._mark_stale("bars")

    def set_model_note(self, text: str) -> None:
        """Say whose forwards the plot shows when that is not the model on screen ("" hides
        the note)."""
        self.model_note.setText(f"<b>{html.escape(text)}</b>" if text else "")
        self.model_note.setToolTip(text)
        self.model_note.setVisible(bool(text))

    @property
    def prediction(self) -> dict[str, float]:
        """The speed model's predicted seconds per module, as drawn."""
        return dict(self._predicted_s)

    @property
    def peaks_gbps(self) -> dict[str, float]:
        """The link peaks drawn, GB/s by source tier."""
        return dict(self._peaks_gbps)

    def add_forward(self, timings: Sequence[LayerTiming]) -> None:
        """Record one forward: the bars show it and the heatmap gains a column (drawn on the
        next timer tick, or by ``refresh()``)."""
        index_of = self._index_of
        columns = [index_of.get(timing.module, -1) for timing in timings]
        if -1 in columns:
            self.set_layers([timing.module for timing in timings])
            columns = [index_of[timing.module] for timing in timings]
        self._history.append(list(timings))
        row = np.zeros(self._heat.width, dtype=np.float32)
        row[columns] = [(timing.transfer_s + timing.compute_s) * 1e3 for timing in timings]
        self._heat.append(row)
        self._forwards_seen += 1
        self._mark_stale("bars", "heat")

    def at_peak_s(self, timing: LayerTiming) -> float | None:
        """Return how long ``timing``'s bytes take at its link's peak bandwidth, or None."""
        peak = self._peaks_gbps.get(_tier(timing.source))
        if not timing.nbytes or not peak:
            return None
        return timing.nbytes / (peak * 1e9)

    def overlapped(self, timing: LayerTiming) -> bool:
        """True when the measured transfer beat the link's peak: prefetch overlapped it."""
        at_peak = self.at_peak_s(timing)
        return at_peak is not None and timing.transfer_s < at_peak * _OVERLAP_MARGIN

    # -- data out ------------------------------------------------------------------------
    @property
    def layers(self) -> list[str]:
        return list(self._layers)

    @property
    def forward_count(self) -> int:
        return len(self._history)

    @property
    def last_forward(self) -> list[LayerTiming]:
        return list(self._history[-1]) if self._history else []

    def heatmap(self) -> np.ndarray:
        """Return a copy of the heatmap, shape (steps, layers), oldest step first, in ms."""
        return self._heat.snapshot()[:, : len(self._layers)]

    def hover_text_at(self, x: float, y: float) -> str:
        """Describe the bar under view coordinates ``(x, y)``: module, bytes, GB/s; "" if none."""
        index = round(x)
        if (
            not self._history
            or abs(x - index) > _BAR_WIDTH / 2
            or not 0 <= index < len(self._layers)
        ):
            return ""
        module = self._layers[index]
        timing = self._last_by_module().get(module)
        if (
            timing is None
            or not 0 <= y <= max((timing.transfer_s + timing.compute_s) * 1e3, 1e-9) * 1.05
        ):
            return ""
        lines = [f"{index}: {module}"]
        if timing.nbytes:
            rate = timing.nbytes / timing.transfer_s if timing.transfer_s > 0 else float("nan")
            lines.append(
                f"transfer {_ms(timing.transfer_s)} from {_tier(timing.source)}, "
                f"{format_nbytes(timing.nbytes)} at {format_bandwidth(rate)}"
            )
        else:
            lines.append("no transfer: the weights stay where they run")
        lines.append(f"compute {_ms(timing.compute_s)}")
        if module in self._predicted_s:
            lines.append(f"predicted {_ms(self._predicted_s[module])}")
        at_peak = self.at_peak_s(timing)
        if at_peak is not None:
            peak = self._peaks_gbps[_tier(timing.source)]
            lines.append(
                f"at the {_tier(timing.source)} link peak ({peak:.1f} GB/s): {_ms(at_peak)}"
            )
            if self.overlapped(timing):
                lines.append("faster than the link: overlapped by prefetch")
        return "\n".join(lines)

    def heat_hover_text_at(self, x: float, y: float) -> str:
        """Describe the heatmap cell at view coordinates ``(x, y)``: step, layer, ms; "" if none."""
        steps = len(self._history)
        column, row = int(np.floor(x)), int(np.floor(y))
        if not (0 <= column < steps and 0 <= row < len(self._layers)):
            return ""
        ms = float(self.heatmap()[column, row])
        first_step = self._forwards_seen - steps  # older steps left the ring
        return (
            f"forward step {first_step + column}\nlayer {row}: {self._layers[row]}\n"
            f"{_ms(ms / 1e3)} (transfer + compute)"
        )

    def to_csv(self) -> str:
        """Return every recorded forward as CSV: one row per (step, layer)."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(
            [
                "step",
                "layer_index",
                "module",
                "source",
                "nbytes",
                "transfer_s",
                "compute_s",
                "gbps",
                "predicted_s",
            ]
        )
        for step, timings in enumerate(self._history):
            for timing in timings:
                predicted = self._predicted_s.get(timing.module)
                writer.writerow(
                    [
                        step,
                        self._index_of[timing.module],
                        timing.module,
                        _tier(timing.source),
                        timing.nbytes,
                        f"{timing.transfer_s:.6g}",
                        f"{timing.compute_s:.6g}",
                        f"{timing.gbps:.4g}",
                        "" if predicted is None else f"{predicted:.6g}",
                    ]
                )
        return buffer.getvalue()

    def export_csv(self, path: str | Path) -> Path:
        """Write ``to_csv()`` to ``path`` atomically and return the path."""
        atomic_write_text(path, self.to_csv())
        return Path(path)

    def export_png(self, path: str | Path) -> Path:
        """Write the three plots as they are on screen to ``path`` (PNG) atomically."""
        return save_png(self.graphics, path)

    # -- control -------------------------------------------------------------------------
    def set_paused(self, paused: bool) -> None:
        """Freeze (True) or resume (False) the display; forwards keep being recorded."""
        self._paused = bool(paused)
        if not paused:
            self.refresh()

    @property
    def paused(self) -> bool:
        return self._paused

    def reset(self) -> None:
        """Forget every recorded forward (layers, prediction and peaks stay)."""
        self._history.clear()
        self._forwards_seen = 0
        self._heat.clear()
        self._mark_stale("bars", "heat")
        self.refresh()

    def clear_layers(self) -> None:
        """Forget the layers, the prediction and every forward (a new model was loaded)."""
        self._layers.clear()
        self._index_of.clear()
        self._predicted_s.clear()
        self._history.clear()
        self._forwards_seen = 0
        self._heat = _heat_ring(self.max_steps)
        self._mark_stale("bars", "prediction", "heat")
        self.refresh()

    def refresh(self) -> None:
        """Draw now the parts whose data changed since the last redraw."""
        if "bars" in self._stale:
            self._redraw_bars()
        if "prediction" in self._stale:
            self._redraw_prediction()
        if self._stale & {"bars", "prediction"}:
            self._fit_bar_y()
        if "heat" in self._stale:
            self._redraw_heat()
        self._stale.clear()
        self._dirty = False
        self.refresh_count += 1

    def _on_timer_timeout(self) -> None:
        if self._dirty and not self._paused and self.isVisible():
            self.refresh()

    # -- drawing -------------------------------------------------------------------------
    def _mark_stale(self, *parts: str) -> None:
        self._stale.update(parts)
        self._dirty = True

    def _reserve(self, layers: int) -> None:
        """Grow the heat ring to hold ``layers`` columns (capacity doubles: amortised O(1))."""
        capacity = self._heat.width
        if layers <= capacity:
            return
        while capacity < layers:
            capacity *= 2
        self._heat.widen(capacity - self._heat.width, fill=0.0)

    def _last_by_module(self) -> dict[str, LayerTiming]:
        return {t.module: t for t in self._history[-1]} if self._history else {}

    def _redraw_bars(self) -> None:
        last = self._history[-1] if self._history else []
        x = np.array([self._index_of[t.module] for t in last], dtype=float)
        transfer_ms = np.array([t.transfer_s * 1e3 for t in last])
        compute_ms = np.array([t.compute_s * 1e3 for t in last])
        tiers = [_tier(t.source) for t in last]
        for tier in sorted(set(tiers) | set(self._tier_bars)):
            mask = np.array([s == tier for s in tiers], dtype=bool)
            bars = self._tier_bars.get(tier)
            if bars is None:
                if tier == "resident":
                    continue
                bars = pg.BarGraphItem(
                    x=[],
                    height=[],
                    width=_BAR_WIDTH,
                    brush=device_qcolor(tier),
                    name=f"from {tier}",
                )
                self.bar_plot.addItem(bars)
                self.legend.addItem(bars, f"from {tier}")
                self._tier_bars[tier] = bars
            bars.setOpts(x=x[mask] if len(x) else [], height=transfer_ms[mask] if len(x) else [])
        self.compute_bars.setOpts(x=x, y0=transfer_ms, height=compute_ms)
        self._redraw_at_peak(last)
        moved = [t for t in last if t.nbytes]
        brushes = [pg.mkBrush(device_qcolor(t.source)) for t in moved]
        bw_x = [self._index_of[t.module] for t in moved]
        self.bw_points.setData(x=bw_x, y=[t.gbps for t in moved], brush=brushes)

    def _redraw_at_peak(self, last: Sequence[LayerTiming]) -> None:
        """Per layer, the transfer time at the link's peak, and a marker on overlapped bars."""
        at_peak_ms = np.full(len(self._layers), np.nan)
        overlap_x, overlap_y = [], []
        for timing in last:
            at_peak = self.at_peak_s(timing)
            if at_peak is None:
                continue
            index = self._index_of[timing.module]
            at_peak_ms[index] = at_peak * 1e3
            if self.overlapped(timing):
                overlap_x.append(index)
                overlap_y.append((timing.transfer_s + timing.compute_s) * 1e3)
        if np.isfinite(at_peak_ms).any():
            edges = np.arange(len(self._layers) + 1, dtype=float) - 0.5
            self.at_peak_curve.setData(edges, at_peak_ms, stepMode="center", connect="finite")
        else:
            self.at_peak_curve.setData([], [])
        self.overlap_points.setData(x=overlap_x, y=overlap_y)

    def _fit_bar_y(self) -> None:
        """Fit y to the tallest bar or line, with room above it: a dashed prediction at the
        top must not merge with (or be clipped by) the frame."""
        last = self._history[-1] if self._history else []
        tops = [(t.transfer_s + t.compute_s) * 1e3 for t in last]
        tops += [(self.at_peak_s(t) or 0.0) * 1e3 for t in last]
        tops += [v * 1e3 for v in self._predicted_s.values()]
        self.bar_plot.setYRange(0.0, max([*tops, 1e-3]) * _HEADROOM, padding=0)

    def _redraw_prediction(self) -> None:
        if self._predicted_s:
            predicted = np.array([self._predicted_s.get(m, np.nan) * 1e3 for m in self._layers])
            edges = np.arange(len(self._layers) + 1, dtype=float) - 0.5
            self.predicted_curve.setData(edges, np.nan_to_num(predicted), stepMode="center")
        else:
            self.predicted_curve.setData([], [])

    def _redraw_heat(self) -> None:
        steps = len(self._history)
        # the image spans (0, 0)-(steps, layers): show exactly that, and an empty map as one
        # step of its layers rather than pyqtgraph's empty-view default (-500 to 500)
        self.heat_plot.setRange(
            xRange=(0, max(steps, 1)), yRange=(0, max(len(self._layers), 1)), padding=0
        )
        if steps == 0 or not self._layers:
            self.heat_image.clear()
            return
        data = self.heatmap()
        levels = (0.0, max(float(data.max()), 1e-6))
        # a step is one byte of each row of the 8-bit indexed QImage pyqtgraph makes
        # (col-major), so a map 1-3 steps wide had rows of 1-3 bytes; Qt documents image rows
        # as 32-bit aligned. Each step is repeated to a multiple of 4 pixels, drawn over the
        # same rectangle. (A rare segfault in ImageItem.paint in the test suite was the reason
        # to look; it is not proven to be this.)
        repeat = 4 // math.gcd(steps, 4)
        self.heat_image.setImage(np.repeat(data, repeat, axis=0), autoLevels=False, levels=levels)
        self.heat_image.setRect(QRectF(0, 0, steps, len(self._layers)))
        self.heat_colorbar.setLevels(levels)  # the bar sets the image's levels too
        self._fit_colorbar_axis()

    def _fit_colorbar_axis(self) -> None:
        """Make the colour bar's axis wide enough for its widest tick label (pyqtgraph's
        fixed width cuts "30" to "3(")."""
        axis = self.heat_colorbar.getAxis("right")
        low, high = self.heat_colorbar.levels()
        labels = [
            label
            for spacing, values in axis.tickValues(low, high, _COLORBAR_AXIS_PX)
            for label in axis.tickStrings(values, 1.0, spacing)
        ]
        font = axis.style.get("tickFont") or self.font()
        widest = max((QFontMetrics(font).horizontalAdvance(t) for t in labels), default=0)
        needed = widest + max(axis.style["tickLength"], 0) + axis.style["tickTextOffset"][0] + 6
        if needed > self._colorbar_axis_px:
            self._colorbar_axis_px = needed
            axis.setWidth(needed)

    def _on_scene_mouse_moved(self, scene_pos: QPointF) -> None:
        text = ""
        for plot, describe in (
            (self.bar_plot, self.hover_text_at),
            (self.heat_plot, self.heat_hover_text_at),
        ):
            view_box = plot.getViewBox()
            if view_box.sceneBoundingRect().contains(scene_pos):
                point = view_box.mapSceneToView(scene_pos)
                text = describe(point.x(), point.y())
                break
        if text:
            QToolTip.showText(QCursor.pos(), text, self.graphics)
        else:
            QToolTip.hideText()


def _compact_title(plot: pg.PlotItem, text: str) -> None:
    """A small one-line title: pyqtgraph's default takes 30 px a low dock cannot spare."""
    plot.setTitle(text, size="9pt")
    plot.titleLabel.setMaximumHeight(_TITLE_PX)
    # a title wider than its plot is cut, rather than pushing the layout (and the heatmap's
    # colour scale) past the widget's right edge
    plot.titleLabel.setMinimumWidth(_TITLE_MIN_PX)
    plot.layout.setRowFixedHeight(0, _TITLE_PX)


def _ms(seconds: float) -> str:
    """Milliseconds: ``"0.14 ms"``, ``"12.50 ms"``, ``"1,250 ms"``; tiny ones keep a digit."""
    ms = seconds * 1e3
    if abs(ms) >= 100:
        return f"{ms:,.0f} ms"
    return f"{ms:.2f} ms" if abs(ms) >= 0.01 or ms == 0 else f"{ms:.1g} ms"
