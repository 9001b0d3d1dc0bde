"""The Pareto view of the joint planner: every precision assignment it placed and scored.

x is the memory on the fastest device (the first one the planner fills), y the predicted
decode tokens/s, the colour the average stored bits per parameter (the colour bar beside the
plot says which); candidates that did not fit sit on the x axis as grey crosses, the chosen
one has a ring. Candidates on the engine's Pareto front (less memory, more tokens/s, more
bits: ``pareto_front``) have a thick outline; the dashed line joins those of them no other
beats on memory and speed alone (the trade-off the two axes show). A click previews the candidate on the
window's lanes (its map at its precisions' sizes) without touching the document; a
double-click applies it: the precision map and the device map as one undo step
(``precision_column.push_precision_plan``). Leaving the view puts the lanes back.

``PrecisionOptions`` is the Planner panel's "Precisions" row: the allowed precisions (empty:
no joint planning), the least average bits, and the button that opens this view.

Example:
    >>> view = ParetoView(window, candidate)  # doctest: +SKIP
    >>> view.preview(0); view.apply(0)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from workbench.gui.precision_column import push_precision_plan
from workbench.runtime import device_label
from workbench.runtime.formatting import format_nbytes, format_rate
from workbench.runtime.precision_session import candidate_outcome, pareto_front

logger = logging.getLogger(__name__)

BINARY_UNITS = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024), ("B", 1))
BITS_COLORMAP = "viridis"
INFEASIBLE_BRUSH = (150, 150, 150, 200)


class PrecisionOptions(QWidget):
    """The Planner panel's "Precisions" row: allowed precisions, min bits, "Pareto view…"."""

    pareto_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.precisions_edit = QLineEdit(self)
        self.precisions_edit.setPlaceholderText("e.g. int4,int8,bf16 (empty: dtype only)")
        self.precisions_edit.setToolTip(
            "Allowed precisions: the comparison adds a precision+placement row that plans a "
            "precision and a device per layer for the fastest predicted decode"
        )
        self.min_bits_spin = QDoubleSpinBox(self)
        self.min_bits_spin.setRange(0.0, 32.0)
        self.min_bits_spin.setSingleStep(0.5)
        self.min_bits_spin.setSpecialValueText("any bits")
        self.min_bits_spin.setToolTip("Least average stored bits per parameter (0: any)")
        self.pareto_button = QPushButton("Pareto…", self)
        self.pareto_button.setToolTip("Every candidate of the precision+placement row")
        self.pareto_button.setEnabled(False)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.precisions_edit, 1)
        layout.addWidget(self.min_bits_spin)
        layout.addWidget(self.pareto_button)
        self.pareto_button.clicked.connect(lambda _c=False: self.pareto_requested.emit())

    def precisions(self) -> str:
        """The allowed precisions as typed (``""``: no joint planning)."""
        return self.precisions_edit.text().strip()

    def min_bits(self) -> float | None:
        """The least average bits, ``None`` for any."""
        value = self.min_bits_spin.value()
        return value if value > 0 else None


class ParetoView(QWidget):
    """The joint planner's candidates as a scatter plot (a window of its own).

    Args:
        window: the main window (session, undo stack, lanes, status bar).
        candidate: the comparison's ``precision+placement`` ``Candidate`` (``joint`` set).
        stale_reason: says why its plans may no longer be applied, asked at each apply
            (``None`` from it: they may); the Planner panel's ``stale_reason``.
    """

    previewed = Signal(int)
    applied = Signal(int)

    def __init__(
        self,
        window: Any,
        candidate: Any,
        *,
        stale_reason: Callable[[], str | None] | None = None,
    ) -> None:
        super().__init__(window, Qt.WindowType.Window)
        self.setObjectName("paretoView")
        self.setWindowTitle("Precision and placement: every candidate")
        self.window_ = window
        self.stale_reason = stale_reason or (lambda: None)
        self.joint = candidate.joint
        self.plan = self.joint.joint.plan  # the engine's PrecisionPlan
        self.candidates = list(self.plan.candidates)
        self.previewing: int | None = None
        self.plot = pg.PlotWidget(self)
        self.plot.setBackground("w")
        item = self.plot.getPlotItem()
        self.unit_name, self.unit_bytes = _binary_unit(
            max((c.fastest_device_bytes() for c in self.candidates), default=0)
        )
        item.setLabel("bottom", f"memory on the fastest device ({self.unit_name})")
        item.setLabel("left", "predicted decode (tok/s)")
        item.getAxis("left").enableAutoSIPrefix(False)  # "0.5", not "500 (x0.001)"
        item.showGrid(x=True, y=True, alpha=0.3)
        self.scatter = pg.ScatterPlotItem(size=14, hoverable=True, tip=None)
        dashed = pg.mkPen((80, 80, 80), width=1, style=Qt.PenStyle.DashLine)
        self.front_line = pg.PlotDataItem(pen=dashed)
        self.chosen_ring = pg.ScatterPlotItem(
            size=26, symbol="o", pen=pg.mkPen((220, 30, 30), width=2.5), brush=None
        )
        self.selected_ring = pg.ScatterPlotItem(
            size=30, symbol="s", pen=pg.mkPen((20, 20, 20), width=2), brush=None
        )
        for plotted in (self.front_line, self.scatter, self.chosen_ring, self.selected_ring):
            item.addItem(plotted)
        for ring in (self.chosen_ring, self.selected_ring):  # under the points: a click
            ring.setZValue(-1)  # goes to the point (pyqtgraph asks the topmost item first)
        bits = [c.average_bits for c in self.candidates if c.feasible] or [4.0, 16.0]
        low, high = min(bits), max(bits)
        if high - low < 0.5:
            low, high = low - 0.25, high + 0.25
        self.colormap = pg.colormap.get(BITS_COLORMAP)
        self.color_bar = pg.ColorBarItem(
            values=(low, high), colorMap=self.colormap, interactive=False, label="average bits"
        )
        item.layout.addItem(self.color_bar, 2, 5)
        self.details = QLabel(self)
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.hint = QLabel(
            "Click a point: preview it on the lanes. Double-click: apply it "
            "(one undo step: the precisions and the map).",
            self,
        )
        layout = QVBoxLayout(self)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.details)
        layout.addWidget(self.hint)
        self._fill(low, high)
        self.scatter.sigClicked.connect(self._on_scatter_clicked)
        window.undo_stack.indexChanged.connect(self._on_undo_stack_index_changed)
        self.resize(820, 560)
        host = window.geometry() if hasattr(window, "geometry") else None
        if host is not None:  # over the tree and the Runtime dock: the lanes stay in view
            self.move(host.left(), max(host.top(), host.bottom() - self.height()))

    # --- the plot ---------------------------------------------------------------------------

    def point_xy(self, index: int) -> tuple[float, float]:
        """Where candidate ``index`` is drawn (``unit_name``, tok/s)."""
        candidate = self.candidates[index]
        return candidate.fastest_device_bytes() / self.unit_bytes, candidate.tokens_per_s

    def _fill(self, low: float, high: float) -> None:
        spots = []
        for index, candidate in enumerate(self.candidates):
            x, y = self.point_xy(index)
            if candidate.feasible:
                share = (candidate.average_bits - low) / (high - low)
                color = self.colormap.map(float(np.clip(share, 0.0, 1.0)), mode="qcolor")
                spot = {"brush": pg.mkBrush(color), "symbol": "o", "pen": pg.mkPen("k")}
            else:
                spot = {"brush": pg.mkBrush(*INFEASIBLE_BRUSH), "symbol": "x", "pen": None}
            spots.append({"pos": (x, y), "data": index, **spot})
        self.scatter.setData(spots)
        chosen = next((i for i, c in enumerate(self.candidates) if c is self.plan.chosen), None)
        if chosen is not None:
            self.chosen_ring.setData([self.point_xy(chosen)[0]], [self.point_xy(chosen)[1]])
        front = self.front_indexes()
        for index in front:  # a thick outline: on the front of memory, speed and bits
            self.scatter.points()[index].setPen(pg.mkPen("k", width=2.5))
        line = self.speed_front_indexes()
        self.front_line.setData(
            [self.point_xy(i)[0] for i in line], [self.point_xy(i)[1] for i in line]
        )
        self.summary = (
            f"{len(self.candidates)} candidates, {len(front)} on the Pareto front (memory, "
            f"speed, bits: thick outline); the ring is the planner's choice: "
            f"{self.plan.chosen.label}"
        )
        self.details.setText(self.summary)

    def front_indexes(self) -> list[int]:
        """Indexes of the candidates on the Pareto front, by memory."""
        ids = {id(c): i for i, c in enumerate(self.candidates)}
        return [ids[id(c)] for c in pareto_front(self.candidates)]

    def speed_front_indexes(self) -> list[int]:
        """The front's candidates no other front candidate beats on both memory and speed,
        by memory (what the dashed line joins)."""
        front = self.front_indexes()
        xy = {i: self.point_xy(i) for i in front}
        return [
            i
            for i in front
            if not any(
                xy[o][0] <= xy[i][0] and xy[o][1] >= xy[i][1] and xy[o] != xy[i] for o in front
            )
        ]

    def _on_undo_stack_index_changed(self, _index: int) -> None:
        if self.previewing is None:  # "Applied: ..." no longer holds after an undo
            self.details.setText(self.summary)

    def _on_scatter_clicked(self, _item: Any, points: Any, event: Any) -> None:
        if not len(points):
            return
        index = int(points[0].data())
        if event is not None and event.double():
            self.apply(index)
        else:
            self.preview(index)

    # --- preview and apply ------------------------------------------------------------------

    def preview(self, index: int) -> bool:
        """Show candidate ``index`` on the lanes (the document stays as it is); return whether
        it had a map to show."""
        candidate = self.candidates[index]
        x, y = self.point_xy(index)
        self.selected_ring.setData([x], [y])
        self.previewing = index
        if not candidate.feasible:
            self.details.setText(f"{candidate.label}: does not fit: {candidate.problem}")
            return False
        session = self.window_.session
        tree, prediction = candidate_outcome(session.opened, candidate, session.profile)
        lanes = getattr(self.window_, "lanes", None)
        if lanes is not None:
            profile = session.profile
            panel = getattr(self.window_, "planner_panel", None)
            lanes.update_lanes(
                tree,
                candidate.device_map,
                dict(session.budgets),
                titles={spec.device: spec.name for spec in profile.devices} if profile else {},
                reserves=panel.lane_reserves(candidate.device_map) if panel else None,
            )
        self.window_.statusBar().showMessage(
            f"Previewing {candidate.label} on the lanes (not applied)", 8000
        )
        speed = format_rate(prediction.tokens_per_s) if prediction else format_rate(y)
        placed = ", ".join(
            f"{device_label(d)} {format_nbytes(n)}" for d, n in candidate.per_device_bytes.items()
        )
        self.details.setText(
            f"Preview (not applied): {candidate.label} · {speed} · "
            f"{candidate.average_bits:.2f} bits/param · {placed}. Double-click to apply."
        )
        self.previewed.emit(index)
        return True

    def apply(self, index: int) -> bool:
        """Apply candidate ``index``: precisions and map as one undo step; return whether it
        changed the document (refused when it did not fit or the comparison is stale)."""
        candidate = self.candidates[index]
        bar = self.window_.statusBar()
        stale = self.stale_reason()
        if not candidate.feasible or stale:
            reason = stale or candidate.problem
            bar.showMessage(f"Cannot apply {candidate.label}: {reason}", 8000)
            return False
        session = self.window_.session
        applied = push_precision_plan(
            self.window_.undo_stack,
            session,
            candidate.device_map,
            candidate.precision_map,
            label=candidate.label,
        )
        self.previewing = None
        self.selected_ring.setData([], [])
        if not applied:
            self.details.setText("Nothing to change: the document has this plan")
        bar.showMessage(f"Applied {candidate.label}" if applied else "Nothing to change", 5000)
        if applied:
            self.applied.emit(index)
        return applied

    def end_preview(self) -> None:
        """Put the lanes back to the document's map."""
        if self.previewing is not None:
            self.previewing = None
            refresh = getattr(self.window_, "refresh", None)
            if refresh is not None:
                refresh()

    def closeEvent(self, event: Any) -> None:
        self.end_preview()
        super().closeEvent(event)


def apply_joint(window: Any, candidate: Any, budgets: dict[Any, int]) -> bool:
    """Apply the comparison's precision+placement row: its precisions, its map and the budgets
    it was planned for, as one undo step; say so in the status bar."""
    plan = candidate.joint.joint.plan
    applied = push_precision_plan(
        window.undo_stack,
        window.session,
        plan.device_map,
        plan.precision_map,
        label=f"precision+placement plan ({plan.chosen.label})",
        budgets=budgets,
    )
    text = f"Applied {plan.chosen.label}" if applied else "The plan equals the current one"
    window.statusBar().showMessage(text, 5000)
    return applied


def _binary_unit(largest_nbytes: int) -> tuple[str, int]:
    """The largest binary unit ``largest_nbytes`` is at least one of (the x axis's)."""
    return next((u for u in BINARY_UNITS if largest_nbytes >= u[1]), BINARY_UNITS[-1])
