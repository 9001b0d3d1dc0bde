"""Per-layer transfer latency: bars for the last forward, a heatmap over the run, bandwidth.

Top left: one bar per hooked layer, transfer time (coloured by the tier the weights came from)
stacked under compute time (grey), with the speed model's prediction as a dashed step line.
Bottom left: achieved GB/s per layer against the link's peak from the hardware profile.
Right: heatmap of time per layer (rows) and forward step (columns).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, QTimer
from PySide6.QtGui import QCursor
from PySide6.QtWidgets import QToolTip, QVBoxLayout, QWidget

from workbench.big_modeling.atomic import atomic_write_text
from workbench.gui.plots import (
    LayerTiming,
    PlotControls,
    cache_static_parts,
    device_qcolor,
    save_png,
)

_COMPUTE_COLOR = "#b0b0b0"
_BAR_WIDTH = 0.8


def _tier(source: str) -> str:
    return source or "resident"


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
        self._history: list[list[LayerTiming]] = []
        self._predicted_s: dict[str, float] = {}
        self._peaks_gbps: dict[str, float] = {}
        self._paused = False
        self._dirty = False
        self.refresh_count = 0
        self._tier_bars: dict[str, pg.BarGraphItem] = {}
        self._peak_lines: list[pg.InfiniteLine] = []
        self._heat = np.zeros((self.max_steps, 0), dtype=np.float32)  # (step, layer), ms

        self.graphics = pg.GraphicsLayoutWidget(self)
        self.graphics.setBackground("w")
        self.bar_plot = self.graphics.addPlot(row=0, col=0, title="Last forward: time per layer")
        self.bar_plot.setLabel("left", "time (ms)")
        self.bar_plot.showGrid(y=True, alpha=0.25)
        self.bar_plot.addLegend(offset=(10, 5), labelTextSize="8pt")
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
        self.bw_plot = self.graphics.addPlot(row=1, col=0, title="Achieved bandwidth vs link peak")
        self.bw_plot.setLabel("left", "GB/s")
        self.bw_plot.setLabel("bottom", "layer index")
        self.bw_plot.showGrid(y=True, alpha=0.25)
        self.bw_plot.setXLink(self.bar_plot)
        self.bw_points = pg.ScatterPlotItem(size=7, pen=None)
        self.bw_plot.addItem(self.bw_points)
        self.heat_plot = self.graphics.addPlot(
            row=0, col=1, rowspan=2, title="Time per layer (ms) by forward step"
        )
        self.heat_plot.setLabel("bottom", "forward step")
        self.heat_plot.setLabel("left", "layer index")
        self.heat_image = pg.ImageItem(axisOrder="col-major")
        self.heat_image.setColorMap(pg.colormap.get("viridis"))
        self.heat_plot.addItem(self.heat_image)
        self.graphics.ci.layout.setColumnStretchFactor(0, 3)
        self.graphics.ci.layout.setColumnStretchFactor(1, 2)
        self.graphics.ci.layout.setRowStretchFactor(0, 3)
        self.graphics.ci.layout.setRowStretchFactor(1, 2)
        self.bar_plot.scene().sigMouseMoved.connect(self._on_scene_mouse_moved)
        for plot in (self.bar_plot, self.bw_plot, self.heat_plot):
            cache_static_parts(plot)

        self.controls = PlotControls(self, self)
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
        for name in modules:
            self._index(name)

    def set_prediction(self, predicted_s: Mapping[str, float]) -> None:
        """Show the speed model's predicted time per module (seconds) as a dashed step line."""
        self._predicted_s = {str(k): float(v) for k, v in predicted_s.items()}
        self.set_layers(list(self._predicted_s))
        self._dirty = True

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

    def add_forward(self, timings: Sequence[LayerTiming]) -> None:
        """Record one forward: the bars show it and the heatmap gains a column (drawn on the
        next timer tick, or by ``refresh()``)."""
        for timing in timings:
            self._index(timing.module)
        self._history.append(list(timings))
        if len(self._history) > self.max_steps:
            self._history.pop(0)
            self._heat[:-1] = self._heat[1:].copy()
        column = np.zeros(len(self._layers), dtype=np.float32)
        for timing in timings:
            column[self._layers.index(timing.module)] = (timing.transfer_s + timing.compute_s) * 1e3
        self._heat[len(self._history) - 1] = column
        self._dirty = True

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
        """Return a copy of the heatmap, shape (steps, layers), in milliseconds."""
        return self._heat[: len(self._history)].copy()

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
        timing = next((t for t in self._history[-1] if t.module == module), None)
        if (
            timing is None
            or not 0 <= y <= max((timing.transfer_s + timing.compute_s) * 1e3, 1e-9) * 1.05
        ):
            return ""
        lines = [
            f"{index}: {module}",
            f"transfer {timing.transfer_s * 1e3:.2f} ms from {_tier(timing.source)}, "
            f"{timing.nbytes / 2**20:.1f} MiB, {timing.gbps:.2f} GB/s",
            f"compute {timing.compute_s * 1e3:.2f} ms",
        ]
        if module in self._predicted_s:
            lines.append(f"predicted {self._predicted_s[module] * 1e3:.2f} ms")
        return "\n".join(lines)

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
                        self._layers.index(timing.module),
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
        self._heat[:] = 0
        self.refresh()

    def clear_layers(self) -> None:
        """Forget the layers, the prediction and every forward (a new model was loaded)."""
        self._layers.clear()
        self._predicted_s.clear()
        self._history.clear()
        self._heat = np.zeros((self.max_steps, 0), dtype=np.float32)
        self.refresh()

    def refresh(self) -> None:
        """Draw the recorded forwards now."""
        self._redraw_bars()
        self._redraw_heat()
        self._dirty = False
        self.refresh_count += 1

    def _on_timer_timeout(self) -> None:
        if self._dirty and not self._paused and self.isVisible():
            self.refresh()

    # -- drawing -------------------------------------------------------------------------
    def _index(self, module: str) -> int:
        if module not in self._layers:
            self._layers.append(module)
            self._heat = np.hstack([self._heat, np.zeros((self.max_steps, 1), dtype=np.float32)])
        return self._layers.index(module)

    def _redraw_bars(self) -> None:
        last = self._history[-1] if self._history else []
        x = np.array([self._layers.index(t.module) for t in last], dtype=float)
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
                self._tier_bars[tier] = bars
            bars.setOpts(x=x[mask] if len(x) else [], height=transfer_ms[mask] if len(x) else [])
        self.compute_bars.setOpts(x=x, y0=transfer_ms, height=compute_ms)
        if self._predicted_s:
            predicted = np.array([self._predicted_s.get(m, np.nan) * 1e3 for m in self._layers])
            edges = np.arange(len(self._layers) + 1, dtype=float) - 0.5
            self.predicted_curve.setData(edges, np.nan_to_num(predicted), stepMode="center")
        else:
            self.predicted_curve.setData([], [])
        brushes = [pg.mkBrush(device_qcolor(t.source)) for t in last if t.nbytes]
        bw_x = [self._layers.index(t.module) for t in last if t.nbytes]
        bw_y = [t.gbps for t in last if t.nbytes]
        self.bw_points.setData(x=bw_x, y=bw_y, brush=brushes)

    def _redraw_heat(self) -> None:
        steps = len(self._history)
        if steps == 0 or not self._layers:
            self.heat_image.clear()
            return
        data = self._heat[:steps]
        self.heat_image.setImage(data, autoLevels=False, levels=(0.0, max(float(data.max()), 1e-6)))

    def _on_scene_mouse_moved(self, scene_pos: QPointF) -> None:
        view_box = self.bar_plot.getViewBox()
        if not view_box.sceneBoundingRect().contains(scene_pos):
            return
        point = view_box.mapSceneToView(scene_pos)
        text = self.hover_text_at(point.x(), point.y())
        if text:
            QToolTip.showText(QCursor.pos(), text, self.graphics)
        else:
            QToolTip.hideText()
