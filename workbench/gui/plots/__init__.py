"""Live plots of the worker: memory over time and per-layer weight transfers.

The widgets take plain numbers (seconds, bytes) through small methods, so they can be driven by
the runtime's events, by a test, or by a benchmark alike:

- ``MemoryPlot.append_sample(t_s, {"cuda:0 allocated": nbytes, ...})``
- ``TransferPlot.add_forward([LayerTiming(...), ...])`` (``workbench.runtime.protocol``'s
  per-layer record; ``summarize_layers(events)`` makes them from the engine's transfer events)

This module holds what both share: device colours, PNG export and the Pause / Reset / Export
button row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QFileDialog,
    QGraphicsItem,
    QHBoxLayout,
    QMessageBox,
    QPushButton,
    QWidget,
)

from workbench.gui.colors import device_color
from workbench.runtime import atomic_path, covering_key
from workbench.runtime.protocol import LayerTiming
from workbench.runtime.telemetry import summarize_layers

GIB = float(1 << 30)


def device_qcolor(device: str | int) -> QColor:
    """Return the colour of ``device`` (or ``"system"``): ``gui.colors``, the tree's and lanes'.

    Example:
        >>> device_qcolor("cpu") == device_color("cpu")  # doctest: +SKIP
        True
    """
    return device_color(device)


def group_layer_timings(
    rows: Iterable[LayerTiming],
    units: Sequence[str],
    *,
    keep: Callable[[str], bool] | None = None,
) -> list[LayerTiming]:
    """Fold per-module rows into one row per layer unit (a no-split block or a leaf owner).

    Hooks time nested modules too (``layers.0``, ``layers.0.self_attn``, ``...q_proj``); adding
    them all would count the same milliseconds several times. Per unit, transfers are summed
    (each weight moves once) and compute is taken from the shallowest modules timed inside it.
    Containers above the units (``model``, the root) are dropped; modules outside every unit
    keep their own row.

    Args:
        rows: per-module ``LayerTiming`` rows, e.g. from ``summarize_layers(events)``.
        units: the layer units in display order (empty: every row is its own unit).
        keep: drops rows whose module it rejects (e.g. names not in the model's tree, such as
            the class-name label hooks give the root).

    Returns:
        Rows in ``units`` order, then the others in order of first appearance.

    Example:
        >>> rows = [LayerTiming("l0", 0.0, 2.0), LayerTiming("l0.attn", 0.0, 1.5)]
        >>> group_layer_timings(rows, ["l0"])[0].compute_s
        2.0
    """
    unit_set = set(units)
    containers = {u.rpartition(".")[0] for u in units}
    for name in list(containers):
        while name:
            name = name.rpartition(".")[0]
            containers.add(name)
    order = list(units)
    acc: dict[str, dict] = {}
    for row in rows:
        if keep is not None and row.module not in unit_set and not keep(row.module):
            continue
        unit = covering_key(row.module, unit_set)
        if unit is None:
            if row.module in containers:
                continue
            unit = row.module
        if unit not in acc:
            acc[unit] = {"transfer_s": 0.0, "nbytes": 0, "source": "", "best": -1, "compute": {}}
            if unit not in unit_set:
                order.append(unit)
        entry = acc[unit]
        entry["transfer_s"] += row.transfer_s
        entry["nbytes"] += row.nbytes
        if row.nbytes > entry["best"]:
            entry["source"], entry["best"] = row.source, row.nbytes
        if row.compute_s:
            depth = row.module.count(".")
            entry["compute"][depth] = entry["compute"].get(depth, 0.0) + row.compute_s
    result = []
    for unit in order:
        entry = acc.get(unit)
        if entry is None:
            continue
        compute = entry["compute"]
        result.append(
            LayerTiming(
                module=unit,
                transfer_s=entry["transfer_s"],
                compute_s=compute[min(compute)] if compute else 0.0,
                nbytes=entry["nbytes"],
                source=entry["source"] if entry["nbytes"] else "",
            )
        )
    return result


def cache_static_parts(plot_item: Any) -> None:
    """Render a plot's axes and legend into cached pixmaps.

    pyqtgraph replays an axis's text as a ``QPicture`` on every repaint of the view, which costs
    tens of ms per axis when only a curve changed. With ``DeviceCoordinateCache`` the axis is
    redrawn only when its range or size changes, so a 10 Hz live plot stays cheap.
    """
    cache = QGraphicsItem.CacheMode.DeviceCoordinateCache
    for name in ("left", "bottom", "right", "top"):
        axis = plot_item.getAxis(name)
        if axis is not None:
            axis.setCacheMode(cache)
    legend = getattr(plot_item, "legend", None)
    if legend is not None:
        legend.setCacheMode(cache)


def nice_ceiling(value: float, steps: Sequence[float] = (1.0, 2.0, 2.5, 5.0)) -> float:
    """Return the smallest of ``steps`` x 10**k that is >= ``value`` (> 0).

    Example:
        >>> nice_ceiling(3.2), nice_ceiling(110, (1, 1.5, 2, 3, 4, 5, 6, 8))
        (5.0, 150.0)
    """
    if value <= 0:
        return 1.0
    exponent = math.floor(math.log10(value))
    for step in (*steps, 10.0):
        candidate = step * 10**exponent
        if candidate >= value:
            return candidate
    return 10.0 ** (exponent + 1)  # pragma: no cover - the loop always returns


def save_png(widget: QWidget, path: str | Path) -> Path:
    """Grab ``widget`` as it is on screen and write it to ``path`` as PNG, atomically.

    Raises:
        OSError: when the image cannot be written.
    """
    target = Path(path)
    pixmap = widget.grab()
    with atomic_path(target) as tmp:
        if not pixmap.save(str(tmp), "PNG"):
            raise OSError(f"could not write PNG image {target}: Qt refused the file")
    return target


def show_export_error(parent: QWidget, path: str | Path, exc: OSError) -> QMessageBox:
    """Tell the user, in a non-modal message box, that writing ``path`` failed and why."""
    reason = exc.strerror or str(exc)
    box = QMessageBox(
        QMessageBox.Icon.Warning,
        "Export failed",
        f"Could not write {path}: {reason}. Nothing was written; choose another file.",
        QMessageBox.StandardButton.Ok,
        parent,
    )
    box.setObjectName("exportErrorDialog")
    box.setDetailedText(str(exc))
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.setModal(False)
    box.show()
    return box


class PlotControls(QWidget):
    """Pause / Reset / Export CSV / Export PNG buttons for one plot.

    The export buttons ask for a path with ``path_chooser`` (a file dialog by default; tests
    inject one) and call ``export_csv(path)`` / ``export_png(path)`` on the plot. A write
    that fails is shown in a non-modal message box (kept in ``last_error_box``).
    """

    paused_changed = Signal(bool)

    def __init__(
        self,
        plot: Any,
        parent: QWidget | None = None,
        *,
        path_chooser: Callable[[str, str], str | None] | None = None,
    ) -> None:
        super().__init__(parent)
        self._plot = plot
        self.path_chooser = path_chooser or self._ask_path
        self.last_error_box: QMessageBox | None = None
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.pause_button = QPushButton("Pause", self)
        self.pause_button.setCheckable(True)
        self.pause_button.setToolTip(
            "Freeze the display to read it; samples keep being collected and show on Resume"
        )
        self.reset_button = QPushButton("Reset", self)
        self.reset_button.setToolTip("Clear this plot: forget the data collected so far")
        self.csv_button = QPushButton("Export CSV…", self)
        self.csv_button.setToolTip(
            "Save all collected data (not only what is on screen) as a CSV file, in time order"
        )
        self.png_button = QPushButton("Export PNG…", self)
        self.png_button.setToolTip("Save the plot as it is shown now as a PNG image")
        for button in (self.pause_button, self.reset_button, self.csv_button, self.png_button):
            layout.addWidget(button)
        layout.addStretch(1)
        self.pause_button.toggled.connect(self._on_pause_toggled)
        self.reset_button.clicked.connect(plot.reset)
        self.csv_button.clicked.connect(self._on_csv_clicked)
        self.png_button.clicked.connect(self._on_png_clicked)

    def _on_pause_toggled(self, paused: bool) -> None:
        self.pause_button.setText("Resume" if paused else "Pause")
        self._plot.set_paused(paused)
        self.paused_changed.emit(paused)

    def _on_csv_clicked(self) -> None:
        path = self.path_chooser("Export plot data", "CSV files (*.csv)")
        if path:
            self._export(self._plot.export_csv, path)

    def _on_png_clicked(self) -> None:
        path = self.path_chooser("Export plot image", "PNG images (*.png)")
        if path:
            self._export(self._plot.export_png, path)

    def _export(self, write: Callable[[str], Any], path: str) -> None:
        try:
            write(path)
        except OSError as exc:
            self.last_error_box = show_export_error(self, path, exc)

    def _ask_path(self, title: str, file_filter: str) -> str | None:
        path, _ = QFileDialog.getSaveFileName(self, title, "", file_filter)
        return path or None


__all__ = [
    "GIB",
    "LayerTiming",
    "PlotControls",
    "cache_static_parts",
    "device_qcolor",
    "group_layer_timings",
    "nice_ceiling",
    "save_png",
    "show_export_error",
    "summarize_layers",
]
