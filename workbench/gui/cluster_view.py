"""The cluster view: plan the open model across a cluster profile and look at the result.

Nodes are drawn as groups of device lanes; each lane is filled, in its stage's colour, to the
share of the GPU the plan uses. The candidates (TP x PP) sit side by side in a table; the
module column lists the model's modules with the colour band of the stage that holds them.
"Export launch scripts…" writes one script per node and a README of the plan.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPen
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from workbench.gui.colors import device_color
from workbench.models.catalog import hub_repo_id
from workbench.models.cluster import list_clusters
from workbench.runtime.cluster_layout import ModelLayout
from workbench.runtime.cluster_plan import plan_cluster
from workbench.runtime.engine_export import export_launch_scripts
from workbench.wording import plural

logger = logging.getLogger(__name__)

LANE_H = 22
NODE_GAP = 10
TITLE_H = 20
GIB = 2**30
ENGINE_CHOICES = ("vllm", "sglang", "llama.cpp")


def stage_color(stage_index: int) -> QColor:
    """The colour band of pipeline stage ``stage_index`` (the GPU palette, by index)."""
    return device_color(stage_index)


class ClusterLanesWidget(QWidget):
    """Nodes as groups of device lanes, filled per stage to the plan's memory use."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.cluster: Any = None
        self.candidate: Any = None
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Minimum)

    def set_plan(self, cluster: Any, candidate: Any) -> None:
        self.cluster, self.candidate = cluster, candidate
        self.updateGeometry()
        self.update()

    def stage_of(self, node: int, gpu: int) -> Any:
        """The stage running on GPU ``gpu`` of node ``node``, or ``None`` when it is idle."""
        if self.candidate is None:
            return None
        for stage in self.candidate.stages:
            if stage.node == node and gpu in stage.gpus:
                return stage
        return None

    def lanes(self) -> list[tuple[int, int, QRectF]]:
        """``(node, gpu, rect)`` of every lane, top to bottom."""
        if self.cluster is None:
            return []
        rects, y = [], 0.0
        width = max(self.width() - 8, 100)
        for n, node in enumerate(self.cluster.nodes):
            y += TITLE_H
            for g in range(len(node.gpus)):
                rects.append((n, g, QRectF(4, y, width, LANE_H - 4)))
                y += LANE_H
            y += NODE_GAP
        return rects

    def sizeHint(self) -> QSize:
        if self.cluster is None:
            return QSize(400, 60)
        gpus = self.cluster.gpu_count
        return QSize(480, len(self.cluster.nodes) * (TITLE_H + NODE_GAP) + gpus * LANE_H)

    def paintEvent(self, event: Any) -> None:
        if self.cluster is None:
            return
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        palette = self.palette()
        text_pen = QPen(palette.windowText().color())
        y = 0.0
        for node in self.cluster.nodes:
            painter.setPen(text_pen)
            link = node.intra_link
            painter.drawText(
                QRectF(4, y, self.width() - 8, TITLE_H),
                Qt.AlignmentFlag.AlignVCenter,
                f"{node.name}: {len(node.gpus)} GPUs, {link.kind} {link.bandwidth_gbps:g} GB/s",
            )
            y += TITLE_H + len(node.gpus) * LANE_H + NODE_GAP
        for n, g, rect in self.lanes():
            gpu = self.cluster.nodes[n].gpus[g]
            stage = self.stage_of(n, g)
            painter.setPen(QPen(palette.mid().color()))
            painter.setBrush(QBrush(palette.base().color()))
            painter.drawRoundedRect(rect, 3, 3)
            label = f"GPU {g} {gpu.name}: idle"
            if stage is not None:
                share = min(stage.total_bytes / gpu.memory_bytes, 1.0)
                fill = QRectF(rect.x(), rect.y(), rect.width() * share, rect.height())
                color = stage_color(stage.index)
                painter.setPen(Qt.PenStyle.NoPen)
                painter.setBrush(QBrush(color))
                painter.drawRoundedRect(fill, 3, 3)
                last = stage.first_layer + stage.layer_count - 1
                label = (
                    f"GPU {g}  stage {stage.index}  layers {stage.first_layer}-{last}  "
                    f"{stage.total_bytes / GIB:.1f} / {gpu.memory_bytes / GIB:.0f} GiB"
                )
            painter.setPen(text_pen)
            painter.drawText(rect.adjusted(6, 0, -6, 0), Qt.AlignmentFlag.AlignVCenter, label)
        painter.end()


class ClusterPlanDialog(QDialog):
    """Plan the opened model on a cluster profile; compare candidates; export scripts."""

    def __init__(self, opened: Any, parent: QWidget | None = None, *, model_ref: str | None = None):
        super().__init__(parent)
        self.setWindowTitle(f"Cluster plan — {opened.label}")
        self.layout_model = ModelLayout.from_opened(opened)
        self.model_ref = model_ref or opened.label
        self.plan: Any = None
        self.clusters = {profile.name: profile for profile in list_clusters()}

        self.cluster_combo = QComboBox()
        self.cluster_combo.addItems(list(self.clusters))
        self.engine_combo = QComboBox()
        self.engine_combo.addItems(list(ENGINE_CHOICES))
        self.context_spin = QSpinBox()
        self.context_spin.setRange(1, 10_000_000)
        self.context_spin.setValue(self.layout_model.max_positions or 4096)
        self.batch_spin = QSpinBox()
        self.batch_spin.setRange(1, 4096)
        self.kv_combo = QComboBox()
        self.kv_combo.addItems(["auto", "fp8"])
        form = QFormLayout()
        form.addRow("Cluster", self.cluster_combo)
        form.addRow("Engine", self.engine_combo)
        form.addRow("Context tokens", self.context_spin)
        form.addRow("Batch", self.batch_spin)
        form.addRow("KV cache dtype", self.kv_combo)

        self.table = QTableWidget(0, 7)
        self.table.setHorizontalHeaderLabels(
            [
                "candidate",
                "GPUs",
                "fits",
                "decode tok/s",
                "pipelined tok/s",
                "prefill tok/s",
                "layers per stage",
            ]
        )
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.lanes_widget = ClusterLanesWidget()
        self.modules = QTreeWidget()
        self.modules.setHeaderLabels(["module", "stage"])
        self.trace_view = QPlainTextEdit()
        self.trace_view.setReadOnly(True)
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)
        self.export_button = QPushButton("Export launch scripts…")

        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.lanes_widget)
        right.addWidget(self.trace_view)
        body = QSplitter(Qt.Orientation.Horizontal)
        body.addWidget(self.modules)
        body.addWidget(right)
        top = QHBoxLayout()
        top.addLayout(form)
        top.addWidget(self.table, 1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.status_label, 1)
        buttons.addWidget(self.export_button)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(body, 1)
        layout.addLayout(buttons)

        for combo in (self.cluster_combo, self.engine_combo, self.kv_combo):
            combo.currentIndexChanged.connect(self._on_settings_changed)
        for spin in (self.context_spin, self.batch_spin):
            spin.valueChanged.connect(self._on_settings_changed)
        self.table.itemSelectionChanged.connect(self._on_table_selection_changed)
        self.export_button.clicked.connect(self._on_export_clicked)
        self.replan()

    def selected_candidate(self) -> Any:
        rows = self.table.selectionModel().selectedRows()
        if self.plan is None or not rows:
            return None
        return self.plan.candidates[rows[0].row()]

    def replan(self) -> None:
        """Plan with the current settings and show the best candidate."""
        cluster = self.clusters[self.cluster_combo.currentText()]
        try:
            self.plan = plan_cluster(
                self.layout_model,
                cluster,
                engine=self.engine_combo.currentText(),
                context_tokens=self.context_spin.value(),
                batch_size=self.batch_spin.value(),
                kv_cache_dtype=self.kv_combo.currentText(),
            )
        except ValueError as exc:  # BadInputError: shown, never raised into Qt
            self.plan = None
            self.status_label.setText(f"Cannot plan: {exc}")
            self.table.setRowCount(0)
            return
        self.table.blockSignals(True)
        self.table.setRowCount(len(self.plan.candidates))
        for row, c in enumerate(self.plan.candidates):
            cells = [
                c.label, str(c.gpus_used), "yes" if c.fits else "no",
                f"{c.decode_tokens_per_s:.3g}", f"{c.pipelined_tokens_per_s:.3g}",
                f"{c.prefill_tokens_per_s:.4g}", ",".join(map(str, c.layer_partition)),
            ]  # fmt: skip
            for column, text in enumerate(cells):
                self.table.setItem(row, column, QTableWidgetItem(text))
        self.table.blockSignals(False)
        if self.plan.candidates:
            self.table.selectRow(0)
        self._show(self.selected_candidate())

    def _show(self, candidate: Any) -> None:
        plan = self.plan
        self.lanes_widget.set_plan(plan.cluster if plan else None, candidate)
        self.modules.clear()
        self.export_button.setEnabled(candidate is not None and candidate.fits)
        if candidate is None:
            return
        for stage in candidate.stages:
            for name in stage.modules:
                item = QTreeWidgetItem([name, f"stage {stage.index}"])
                color = stage_color(stage.index)
                item.setBackground(1, QBrush(color))
                item.setData(1, Qt.ItemDataRole.UserRole, stage.index)
                self.modules.addTopLevelItem(item)
        verdict = "fits" if candidate.fits else "does not fit"
        self.status_label.setText(
            f"{candidate.label} {verdict}: {candidate.decode_tokens_per_s:.3g} tok/s decode, "
            f"{candidate.prefill_tokens_per_s:.4g} tok/s prefill"
        )
        self.trace_view.setPlainText("\n".join([*plan.trace, *candidate.trace]))

    def export_scripts(self, folder: str | Path | None = None) -> list[Path]:
        """Write the selected candidate's launch scripts into ``folder`` (asks when ``None``)."""
        candidate = self.selected_candidate()
        if self.plan is None or candidate is None:
            return []
        if folder is None:
            folder = QFileDialog.getExistingDirectory(self, "Export launch scripts to")
            if not folder:
                return []
        try:
            written = export_launch_scripts(
                self.plan, folder, candidate=candidate, model_ref=self.model_ref
            )
        except (OSError, ValueError) as exc:
            self.status_label.setText(f"Export failed: {exc}")
            logger.warning("cluster export to %s failed: %s", folder, exc)
            return []
        self.status_label.setText(f"Wrote {plural(len(written), 'file')} to {folder}")
        return written

    def _on_settings_changed(self, *_: Any) -> None:
        self.replan()

    def _on_table_selection_changed(self) -> None:
        self._show(self.selected_candidate())

    def _on_export_clicked(self) -> None:
        self.export_scripts()


def show_cluster_plan(window: Any) -> ClusterPlanDialog | None:
    """Open the cluster view on the window's model (a status message when none is open)."""
    opened = window.session.opened
    if opened is None:
        window.statusBar().showMessage("Open a model first to plan it across a cluster", 5000)
        return None
    dialog = ClusterPlanDialog(opened, window, model_ref=hub_repo_id(str(opened.source)))
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.resize(1100, 700)
    dialog.show()
    return dialog
