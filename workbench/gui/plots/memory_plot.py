"""Memory over time: one line per device and kind, budgets as dashed lines, phase markers.

Samples go into a preallocated ``RingBuffer`` (twice the window long, so the visible window is
always one contiguous slice). A GUI-thread timer looks at them ``refresh_hz`` times a second and
redraws only when the picture would change at the current pixel resolution: a new sample at
least a pixel to the right of the last drawn one, a value that moved a pixel, a new series or a
range step. Most redraws touch only the newest few pixels: each series is a long "body" curve
plus a short "tail" curve holding the samples since the body was last set, so Qt repaints the
tail's small rectangle; the tail folds into the body once it spans ``_TAIL_PX`` pixels. Bodies
get only the visible slice, with clip-to-view and peak downsampling, so a window at rest fed 10
samples a second stays well under 5% of a core.

The y range fits the worker's own lines (rss, CUDA memory). A reference line (a device budget,
the system's available memory) is fitted too when it is within ``OFF_SCALE_FACTOR`` times the
worker's peak; one further up would flatten the worker's lines to the floor, so it stays off the
scale and the row above the plot names it with its value ("▲ off scale: cpu budget 22.2 GiB").
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QGraphicsItem, QLabel, QVBoxLayout, QWidget

from workbench.gui.plots import (
    GIB,
    PlotControls,
    cache_static_parts,
    device_qcolor,
    nice_ceiling,
    save_png,
)
from workbench.runtime import atomic_write_text
from workbench.runtime.ring_buffer import RingBuffer

_STYLE = {
    "allocated": Qt.PenStyle.SolidLine,
    "reserved": Qt.PenStyle.DashLine,
    "nvml": Qt.PenStyle.DotLine,
    "rss": Qt.PenStyle.SolidLine,
    "available": Qt.PenStyle.DashDotLine,
    "file-backed": Qt.PenStyle.DashLine,
}
_LEGEND_NOTE = {"file-backed": " (part of rss, reclaimable)"}  # kinds a bare name would mislead on
_CSV_LAST = ("worker file-backed",)  # CSV columns added after the format was in use
_MAX_MARKERS = 64
_MARKER_LABEL_POSITIONS = (0.78, 0.36)  # along the line from the bottom: two label rows
_BUDGET_LABEL_SPAN = (0.02, 0.72)  # where a budget label may sit along x: not under the legend
_X_MARGIN = 0.02  # the x range starts this fraction of its span left of the first event
_TAIL_PX = 256.0  # a tail wider than this folds into its body (a full redraw)
_X_STEPS = (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)  # finer than y: little blank time on the right
_REFERENCE_SERIES = ("system available",)  # context, not what the worker holds
_LEGEND_ROW_PX = 18  # one row of legend entries above the plot
_LEGEND_COLUMNS = 3  # entries per legend row ("worker file-backed (…)" is the widest)
OFF_SCALE_FACTOR = 3.0  # a reference line up to 3x the worker's peak is fitted; higher, marked


def _legend_above_view(item: pg.PlotItem) -> pg.LegendItem:
    """One legend row in the plot's (unused) title row, above the view box: a legend inside
    the view would pale every line under it (the newest samples, on the right)."""
    legend = pg.LegendItem(
        labelTextSize="8pt",
        colCount=_LEGEND_COLUMNS,
        horSpacing=12,
        brush=pg.mkBrush(255, 255, 255, 0),
    )
    legend.layout.setContentsMargins(2, 0, 2, 0)
    item.legend = legend  # curves plotted with a name join it, as with addLegend
    item.layout.removeItem(item.titleLabel)  # the plot has no title: its cell is free
    item.titleLabel.setVisible(False)
    item.layout.addItem(legend, 0, 1)
    _fit_legend_rows(item, 1)
    return legend


def _fit_legend_rows(item: pg.PlotItem, entries: int) -> None:
    """Make the legend's row of the plot as tall as its ``entries`` need."""
    rows = max(1, math.ceil(entries / _LEGEND_COLUMNS))
    item.legend.setMaximumHeight(rows * _LEGEND_ROW_PX)
    item.layout.setRowFixedHeight(0, rows * _LEGEND_ROW_PX)


class SampleRing:
    """Named time series over one ``RingBuffer``: ``capacity`` rows of ``t_s`` plus one column
    per series (NaN where a series had no value); ``view()`` is one contiguous slice, no copy.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(2, int(capacity))
        self.names: list[str] = []
        self._rows = RingBuffer(self.capacity, width=1)  # column 0: t_s

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def appended(self) -> int:
        """Samples ever appended (the redraw check counts new rows with it)."""
        return self._rows.total_appended

    def column(self, name: str) -> int:
        """Return the column of ``name``, adding one (NaN for earlier rows) if new."""
        if name in self.names:
            return self.names.index(name)
        self.names.append(name)
        self._rows.widen(1)
        return len(self.names) - 1

    def append(self, t_s: float, values: Mapping[str, float]) -> None:
        columns = [(self.column(name), float(v)) for name, v in values.items()]
        row = np.full(len(self.names) + 1, np.nan)
        row[0] = t_s
        for col, value in columns:
            row[col + 1] = value
        self._rows.append(row)

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(t_s, values)`` views of the stored rows, oldest first (no copy)."""
        rows = self._rows.view()
        return rows[:, 0], rows[:, 1:]

    def clear(self) -> None:
        self._rows.clear()


class MemoryPlot(QWidget):
    """Live memory plot of the worker and the system.

    Series are named ``"<device> <kind>"``: ``"cuda:0 allocated"``, ``"cuda:0 reserved"``,
    ``"cuda:0 nvml"``, ``"worker rss"``, ``"worker file-backed"`` (the mapped-file part of the
    rss, dashed; its legend says it is reclaimable), ``"system available"``. Values are bytes;
    the axis shows GiB. Times are seconds on any monotonic clock; the axis starts at the first
    sample.

    Example:
        >>> plot = MemoryPlot()  # doctest: +SKIP
        >>> plot.append_sample(0.0, {"worker rss": 2**30})  # doctest: +SKIP
    """

    def __init__(
        self, parent: QWidget | None = None, *, window_s: float = 600.0, refresh_hz: float = 10.0
    ) -> None:
        super().__init__(parent)
        self._ring = SampleRing(int(window_s * 20))  # room for 20 samples/s over the window
        self._t0_s: float | None = None
        self._curves: dict[str, pg.PlotDataItem] = {}
        self._tails: dict[str, pg.PlotCurveItem] = {}
        self.full_redraw_count = 0
        self._budget_lines: dict[str, pg.InfiniteLine] = {}
        self._markers: list[tuple[float, str, pg.InfiniteLine]] = []
        self._marker_count = 0
        self._dirty = False
        self._paused = False
        self.refresh_count = 0
        self.skipped_count = 0  # timer ticks with new samples that would not change a pixel
        self._drawn: tuple[int, int, float, np.ndarray] | None = None  # what the curves show
        self._body_end: tuple[int, float] | None = None  # (samples appended, t_s) in the bodies

        self.plot_widget = pg.PlotWidget(self, background="w")
        item = self.plot_widget.getPlotItem()
        item.setLabel("bottom", "time", units="s")
        item.setLabel("left", "memory (GiB)")
        item.getAxis("left").enableAutoSIPrefix(False)  # GiB stay GiB: no "(x0.001)" at 200 MiB
        item.showGrid(x=True, y=True, alpha=0.25)
        item.setClipToView(True)
        item.setDownsampling(auto=True, mode="peak")
        self.legend = _legend_above_view(item)
        # ranges move in steps, not with every sample, so the cached axes are rarely redrawn
        item.disableAutoRange()
        self._x_min = 0.0
        self._x_max = 0.0
        self._y_max = 0.0
        cache_static_parts(item)
        self.controls = PlotControls(self, self)
        self.off_scale_label = QLabel("", self.controls)
        self.off_scale_label.setObjectName("offScaleLabel")
        self.off_scale_label.setToolTip(
            "Lines above the plotted range: the y axis fits the worker's memory so its lines "
            "are readable. Hide series in the legend to refit."
        )
        self.controls.layout().addWidget(self.off_scale_label)
        self.off_scale: dict[str, float] = {}  # reference lines above the range: name -> GiB
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(self.controls)
        layout.addWidget(self.plot_widget, 1)

        self.timer = QTimer(self)
        self.timer.setInterval(max(10, int(1000 / refresh_hz)))
        self.timer.timeout.connect(self._on_timer_timeout)
        self.timer.start()

    # -- data in -------------------------------------------------------------------------
    def append_sample(self, t_s: float, values_bytes: Mapping[str, float]) -> None:
        """Record one sample: series name -> bytes at time ``t_s`` (seconds)."""
        if self._t0_s is None:
            self._t0_s = t_s
        self._ring.append(t_s - self._t0_s, values_bytes)
        self._dirty = True

    def set_budgets(self, budgets_bytes: Mapping[str | int, int]) -> None:
        """Draw one dashed horizontal line per device budget (bytes); replaces earlier ones.

        The y range always includes every budget line, so a budget above the data stays on
        screen and the user sees the headroom.
        """
        item = self.plot_widget.getPlotItem()
        for line in self._budget_lines.values():
            item.removeItem(line)
        self._budget_lines.clear()
        for device, nbytes in budgets_bytes.items():
            label = f"cuda:{device}" if isinstance(device, int) else str(device)
            if label == "disk" or not nbytes:
                continue
            pen = pg.mkPen(device_qcolor(device), width=1, style=Qt.PenStyle.DashLine)
            line = pg.InfiniteLine(
                pos=nbytes / GIB,
                angle=0,
                pen=pen,
                label=f"{label} budget",
                labelOpts={
                    "position": 0.3,  # moved into a gap between markers by _place_budget_labels
                    "color": device_qcolor(device),
                    "anchors": [(0.5, 1), (0.5, 1)],  # centred, just above the line
                },
            )
            item.addItem(line, ignoreBounds=True)
            self._budget_lines[label] = line
        self._place_budget_labels()
        self._y_max = 0.0  # the next refresh fits the new budgets
        self._dirty = True

    def add_marker(self, t_s: float, label: str) -> None:
        """Mark an event (load start/end, an inference) with a vertical line at ``t_s``."""
        if self._t0_s is None:
            self._t0_s = t_s
        x = t_s - self._t0_s
        line = pg.InfiniteLine(
            pos=x,
            angle=90,
            pen=pg.mkPen("#555555", width=1, style=Qt.PenStyle.DotLine),
            label=label,
            labelOpts={
                # alternate high and low, so events close in time keep readable labels
                "position": _MARKER_LABEL_POSITIONS[self._marker_count % 2],
                "color": "#333333",
                "rotateAxis": (1, 0),
            },
        )
        self._marker_count += 1
        self.plot_widget.getPlotItem().addItem(line, ignoreBounds=True)
        self._markers.append((x, label, line))
        if len(self._markers) > _MAX_MARKERS:
            _, _, old = self._markers.pop(0)
            self.plot_widget.getPlotItem().removeItem(old)
        if not self._x_min <= x <= self._x_max:
            self._body_end = None  # the x range must grow to show it: a full redraw
        self._place_budget_labels()
        self._dirty = True

    # -- data out ------------------------------------------------------------------------
    @property
    def series_names(self) -> list[str]:
        return list(self._ring.names)

    @property
    def sample_count(self) -> int:
        return len(self._ring)

    @property
    def marker_labels(self) -> list[str]:
        return [label for _, label, _ in self._markers]

    def latest(self, name: str) -> float | None:
        """Return the newest recorded value of series ``name`` (bytes), or ``None``."""
        if name not in self._ring.names or not len(self._ring):
            return None
        value = self._ring.view()[1][-1, self._ring.names.index(name)]
        return None if math.isnan(value) else float(value)

    def set_series_visible(self, name: str, visible: bool) -> None:
        """Show or hide series ``name`` (as clicking its legend entry does); the y range fits
        the visible series and the budgets, so hiding "system available" zooms onto the rest."""
        curve = self._curves.get(name) or self._make_curve(name)
        curve.setVisible(visible)

    def curve(self, name: str) -> pg.PlotDataItem | None:
        """Return the body curve of ``name`` (the newest samples may sit in its tail)."""
        return self._curves.get(name)

    def drawn_data(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Return what is drawn for series ``name``: ``(t_s, GiB)`` of its body then tail."""
        body = self._curves.get(name)
        if body is None:
            return np.zeros(0), np.zeros(0)
        x, y = body.getOriginalDataset()
        x = np.zeros(0) if x is None else np.asarray(x)
        y = np.zeros(0) if y is None else np.asarray(y)
        tail_x, tail_y = self._tails[name].getData()
        if tail_x is not None and len(tail_x) > 1:
            x, y = np.concatenate([x, tail_x[1:]]), np.concatenate([y, tail_y[1:]])
        return x, y

    def to_csv(self) -> str:
        """Return the samples and markers as CSV text, in time order.

        Columns: ``t_s``, one per series in bytes, then ``marker``. A sample row leaves
        ``marker`` empty; a marker row has only ``t_s`` and the marker's label. Series come in
        the order they first appeared, except that ``"worker file-backed"`` (added to the
        format later) comes after the other series, so readers that count columns from the left
        still find the ones they knew, with or without CUDA series.
        """
        names = self._ring.names
        order = sorted(range(len(names)), key=lambda col: names[col] in _CSV_LAST)
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["t_s", *(f"{names[col]} (bytes)" for col in order), "marker"])
        t_s, values = self._ring.view()
        values = values[:, order]
        markers = sorted((x, label) for x, label, _ in self._markers)
        next_marker = 0
        blank = [""] * len(names)
        for k in range(len(t_s)):
            while next_marker < len(markers) and markers[next_marker][0] <= t_s[k]:
                x, label = markers[next_marker]
                writer.writerow([f"{x:.3f}", *blank, label])
                next_marker += 1
            cells = ["" if math.isnan(v) else str(int(v)) for v in values[k]]
            writer.writerow([f"{t_s[k]:.3f}", *cells, ""])
        for x, label in markers[next_marker:]:
            writer.writerow([f"{x:.3f}", *blank, label])
        return buffer.getvalue()

    def export_csv(self, path: str | Path) -> Path:
        """Write ``to_csv()`` to ``path`` atomically and return the path."""
        atomic_write_text(path, self.to_csv())
        return Path(path)

    def export_png(self, path: str | Path) -> Path:
        """Write the plot as it is on screen to ``path`` (PNG) atomically."""
        return save_png(self.plot_widget, path)

    # -- control -------------------------------------------------------------------------
    def set_paused(self, paused: bool) -> None:
        """Freeze (True) or resume (False) the display; samples keep being recorded."""
        self._paused = bool(paused)
        if not paused:
            self._dirty = True

    def set_refresh_hz(self, refresh_hz: float) -> None:
        """Redraw at most ``refresh_hz`` times a second (10 by default)."""
        self.timer.setInterval(max(10, int(1000 / max(refresh_hz, 0.1))))

    @property
    def paused(self) -> bool:
        return self._paused

    def reset(self) -> None:
        """Forget every sample and marker (budgets stay)."""
        self._ring.clear()
        self._t0_s = None
        self._x_min = self._x_max = self._y_max = 0.0
        item = self.plot_widget.getPlotItem()
        for _, _, line in self._markers:
            item.removeItem(line)
        self._markers.clear()
        self._marker_count = 0
        for curve in (*self._curves.values(), *self._tails.values()):
            curve.setData([], [])
        self._dirty = False
        self._drawn = self._body_end = None

    def refresh(self) -> None:
        """Push the stored samples to the curves now: only the tails when the new samples fit
        in them and the ranges hold, else every body (a full redraw)."""
        t_s, values = self._ring.view()
        if not len(t_s):
            if self._markers:  # events before the first sample: show them already
                xs = [x for x, _, _ in self._markers]
                self._step_ranges(min(xs), max(xs), values)
            self._dirty = False
            return
        if not self._extend_tails(t_s, values):
            x_min = self._step_ranges(float(t_s[0]), float(t_s[-1]), values)
            first = max(0, int(np.searchsorted(t_s, x_min)) - 1)  # one point left of the view
            for col, name in enumerate(self._ring.names):
                curve = self._curves.get(name) or self._make_curve(name)
                curve.setData(t_s[first:], values[first:, col] / GIB, connect="finite")
                self._tails[name].setData([], [])
            self._body_end = (self._ring.appended, float(t_s[-1]))
            self.full_redraw_count += 1
        self._drawn = (self._ring.appended, len(self._ring.names), float(t_s[-1]), values[-1])
        self._dirty = False
        self.refresh_count += 1

    def _extend_tails(self, t_s: np.ndarray, values: np.ndarray) -> bool:
        """Draw the samples since the bodies' end as tails, if they fit in the current ranges
        and span at most ``_TAIL_PX`` pixels; False when a full redraw is due."""
        if self._body_end is None or len(self._ring.names) != len(self._curves):
            return False
        appended, end_s = self._body_end
        since = self._ring.appended - appended
        if since >= len(t_s) or t_s[-1] > self._x_max:
            return False
        s_per_px = self.plot_widget.getPlotItem().getViewBox().viewPixelSize()[0]
        if (t_s[-1] - end_s) / s_per_px > _TAIL_PX:
            return False
        rows = slice(len(t_s) - since - 1, len(t_s))  # from the bodies' last sample on
        fitted = [
            col
            for col, name in enumerate(self._ring.names)
            if self._shown(name) and name not in _REFERENCE_SERIES
        ]
        new = values[rows, fitted]  # a reference line may sit above the range: not a reason
        if np.isfinite(new).any() and np.nanmax(new) > self._y_max * GIB:
            return False
        for col, name in enumerate(self._ring.names):
            self._tails[name].setData(t_s[rows], values[rows, col] / GIB, connect="finite")
        return True

    def would_change_view(self) -> bool:
        """Return whether samples recorded since the last redraw would change a pixel."""
        if self._drawn is None or self._body_end is None or not len(self._ring):
            return True
        appended, series, last_s, last_values = self._drawn
        t_s, values = self._ring.view()
        if len(self._ring.names) != series or t_s[-1] > self._x_max:
            return True
        view_box = self.plot_widget.getPlotItem().getViewBox()
        s_per_px, gib_per_px = view_box.viewPixelSize()
        if t_s[-1] - last_s >= s_per_px:
            return True
        new = values[-min(len(t_s), self._ring.appended - appended) :]
        with np.errstate(invalid="ignore"):
            moved = np.abs(new - last_values) >= gib_per_px * GIB
            appeared = np.isfinite(new) != np.isfinite(last_values)
        return bool(moved.any() or appeared.any())

    def _step_ranges(self, first_s: float, last_s: float, values: np.ndarray) -> float:
        """Grow the x range by doubling (then slide by a quarter window) and the y range in
        1-2-2.5-5 steps, so ranges change a few times per run instead of on every sample.
        The x range covers the markers too (a load's start comes before its first sample) and
        the y range covers the data and every budget line. Returns the left end of x."""
        window_s = self._ring.capacity / 20
        if self._markers:
            xs = [x for x, _, _ in self._markers]
            first_s, last_s = min(first_s, *xs), max(last_s, *xs)
        if last_s > self._x_max or last_s < self._x_max - window_s:
            span = max(10.0, last_s - first_s)
            self._x_max = (
                first_s + nice_ceiling(span * 1.1, _X_STEPS)
                if span < window_s * 0.75
                else last_s + window_s / 4
            )
        margin = (self._x_max - first_s) * _X_MARGIN  # a marker at the start is not on the axis
        x_min = max(first_s - margin, self._x_max - window_s)
        self._x_min = x_min
        first = max(0, int(np.searchsorted(self._ring.view()[0], x_min)) - 1)
        data_gib, references = self._peaks_in_view(values[first:])
        if data_gib is None:  # nothing of the worker's shown yet: fit the references
            peak_gib = max([1.0, *references.values()])
        else:
            limit = max(data_gib, 1 / 1024) * OFF_SCALE_FACTOR
            peak_gib = max([data_gib, *(v for v in references.values() if v <= limit)])
        if peak_gib > self._y_max or peak_gib < self._y_max / 4:
            self._y_max = nice_ceiling(peak_gib * 1.1)
        self._show_off_scale({name: v for name, v in references.items() if v > self._y_max})
        view_box = self.plot_widget.getPlotItem().getViewBox()
        view_box.setRange(xRange=(x_min, self._x_max), yRange=(0.0, self._y_max), padding=0)
        self._place_budget_labels()
        return x_min

    def _peaks_in_view(self, values: np.ndarray) -> tuple[float | None, dict[str, float]]:
        """The worker's peak (GiB, None without data) and each shown reference line's value:
        budgets, and the newest "system available" (GiB)."""
        data_peak: float | None = None
        references = {f"{name} budget": line.value() for name, line in self._budget_lines.items()}
        for col, name in enumerate(self._ring.names):
            column = values[:, col]
            if not self._shown(name) or not np.isfinite(column).any():
                continue
            if name in _REFERENCE_SERIES:
                references[name] = float(column[np.isfinite(column)][-1]) / GIB
            else:
                peak = float(np.nanmax(column)) / GIB
                data_peak = peak if data_peak is None else max(data_peak, peak)
        return data_peak, references

    def _show_off_scale(self, off_scale: dict[str, float]) -> None:
        if off_scale == self.off_scale:
            return
        self.off_scale = off_scale
        parts = []
        for name, gib in sorted(off_scale.items(), key=lambda item: item[1]):
            device = name.split(" ", 1)[0]
            color = device_qcolor("system" if name in _REFERENCE_SERIES else device).name()
            parts.append(f'<span style="color:{color}">{name} {gib:.1f} GiB</span>')
        self.off_scale_label.setText("▲ off scale: " + " · ".join(parts) if parts else "")

    def _place_budget_labels(self) -> None:
        """Put each budget's label in the widest gap between marker lines, left of the legend,
        so marker labels (rotated, on their lines) never run over it."""
        if not self._budget_lines:
            return
        left, right = _BUDGET_LABEL_SPAN
        width = self._x_max - self._x_min
        cuts = [left]
        if width > 0:
            cuts += sorted(
                fraction
                for x, _, _ in self._markers
                if left < (fraction := (x - self._x_min) / width) < right
            )
        cuts.append(right)
        gap_start, gap_end = max(itertools.pairwise(cuts), key=lambda gap: gap[1] - gap[0])
        position = (gap_start + gap_end) / 2
        for line in self._budget_lines.values():
            if (
                line.label.orthoPos != position
            ):  # runs every refresh: move (and redraw) only on change
                line.label.setPosition(position)

    @property
    def budget_label_positions(self) -> dict[str, float]:
        """Where each budget's label sits along x, as a fraction of the view (0 = left)."""
        return {name: line.label.orthoPos for name, line in self._budget_lines.items()}

    def _shown(self, name: str) -> bool:
        curve = self._curves.get(name)
        return curve is None or curve.isVisible()

    def _on_curve_visible_changed(self, name: str) -> None:
        self._tails[name].setVisible(self._curves[name].isVisible())
        self._y_max = 0.0  # refit y to what is shown now
        self._body_end = None
        self._dirty = True

    def _make_curve(self, name: str) -> pg.PlotDataItem:
        device, _, kind = name.partition(" ")
        color = device_qcolor("cpu" if device == "worker" else device)
        style = _STYLE.get(kind, Qt.PenStyle.SolidLine)
        width = 2 if style == Qt.PenStyle.SolidLine else 1  # a wide dashed stroke costs most
        pen = pg.mkPen(color, width=width, style=style)
        label = name + _LEGEND_NOTE.get(kind, "")
        curve = self.plot_widget.getPlotItem().plot([], [], pen=pen, name=label)
        curve.setClipToView(True)
        curve.setDownsampling(auto=True, method="peak")
        curve.curve.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)  # tails repaint
        tail = pg.PlotCurveItem(pen=pen)
        self.plot_widget.getPlotItem().addItem(tail, ignoreBounds=True)
        self._curves[name], self._tails[name] = curve, tail
        _fit_legend_rows(self.plot_widget.getPlotItem(), len(self._curves))
        curve.visibleChanged.connect(lambda: self._on_curve_visible_changed(name))
        return curve

    def _on_timer_timeout(self) -> None:
        if not self._dirty or self._paused or not self.isVisible():
            return
        if self.would_change_view():
            self.refresh()
        else:
            self.skipped_count += 1
