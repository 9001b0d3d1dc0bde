"""The cluster view: plan the open model across a cluster profile and look at the result.

Nodes are drawn as groups of device lanes; each lane is filled, in its stage's colour, to the
share of the GPU the plan uses. The candidates (TP x PP) sit side by side in a table; the
module list groups the model's modules under the stage that holds them, with its colour band.
The candidate shown also bands the main window's module tree (``stage_bands``), until its
legend's "Clear" or another model. "Export launch scripts…" writes one script per node and a
README of the plan. Figures use the app's formatting (``runtime.formatting``): no exponents.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import QRectF, QSize, Qt, Signal
from PySide6.QtGui import QBrush, QPainter, QPen
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
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

from workbench.gui.colors import over_budget_color, stage_color
from workbench.gui.stage_bands import install_stage_bands, stage_words
from workbench.models.catalog import hub_repo_id
from workbench.models.cluster import list_clusters
from workbench.runtime import AS_STORED, DTYPE_CHOICES
from workbench.runtime.cluster_layout import ModelLayout
from workbench.runtime.cluster_plan import plan_cluster
from workbench.runtime.engine_export import export_launch_scripts
from workbench.runtime.formatting import format_nbytes, format_rate
from workbench.wording import plural

logger = logging.getLogger(__name__)

LANE_H = 22
NODE_GAP = 10
TITLE_H = 20
GIB = 2**30
ENGINE_CHOICES = ("vllm", "sglang", "llama.cpp")
TABLE_HEADERS = (
    "candidate", "GPUs", "fits", "decode", "pipelined", "prefill", "peak per GPU",
    "layers per stage",
)  # fmt: skip
__all__ = ["ClusterLanesWidget", "ClusterPlanDialog", "show_cluster_plan", "stage_color"]


def _layers_words(stage: Any) -> str:
    last = stage.first_layer + stage.layer_count - 1
    return f"layers {stage.first_layer}-{last}"


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
                label = (
                    f"GPU {g}  stage {stage.index}  {_layers_words(stage)}  "
                    f"{format_nbytes(stage.total_bytes)} / {format_nbytes(gpu.memory_bytes)}"
                )
                if not stage.fits:  # a red outline: the stage needs more than its budget
                    painter.setPen(QPen(over_budget_color(), 2))
                    painter.setBrush(Qt.BrushStyle.NoBrush)
                    painter.drawRoundedRect(rect, 3, 3)
                    label += f"  over the {format_nbytes(stage.budget_bytes)} budget"
            painter.setPen(text_pen)
            painter.drawText(rect.adjusted(6, 0, -6, 0), Qt.AlignmentFlag.AlignVCenter, label)
        painter.end()


class ClusterPlanDialog(QDialog):
    """Plan the opened model on a cluster profile; compare candidates; export scripts.

    ``candidate_shown`` carries the candidate on screen (``None`` when nothing is planned), for
    the main tree's stage bands.
    """

    candidate_shown = Signal(object)

    def __init__(
        self,
        opened: Any,
        parent: QWidget | None = None,
        *,
        model_ref: str | None = None,
        dtype: str = AS_STORED,
    ):
        super().__init__(parent)
        self.setWindowTitle(f"Cluster plan — {opened.label}")
        self.opened = opened
        self._layouts: dict[str, ModelLayout] = {}
        initial_dtype = dtype if dtype in DTYPE_CHOICES else AS_STORED
        self.layout_model = self._layout_for(initial_dtype)
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
        self.dtype_combo = QComboBox()
        self.dtype_combo.addItems([AS_STORED, *DTYPE_CHOICES])
        self.dtype_combo.setToolTip(
            "The dtype the engine serves the weights in (float8_e4m3fn: an fp8 checkpoint such "
            "as DeepSeek-V3's); activations and an 'auto' KV cache stay 16-bit"
        )
        self.dtype_combo.setCurrentText(initial_dtype)
        form = QFormLayout()
        form.addRow("Cluster", self.cluster_combo)
        form.addRow("Engine", self.engine_combo)
        form.addRow("Context tokens", self.context_spin)
        form.addRow("Batch", self.batch_spin)
        form.addRow("Weights", self.dtype_combo)
        form.addRow("KV cache dtype", self.kv_combo)

        self.table = QTableWidget(0, len(TABLE_HEADERS))
        self.table.setHorizontalHeaderLabels(list(TABLE_HEADERS))
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.lanes_widget = ClusterLanesWidget()
        self.modules = QTreeWidget()
        self.modules.setHeaderLabels(["module", "stage", "per GPU"])
        self.modules.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        header = self.modules.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in (1, 2):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.trace_view = QPlainTextEdit()
        self.trace_view.setReadOnly(True)
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)
        self.export_button = QPushButton("Export launch scripts…")

        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.lanes_widget)
        right.addWidget(self.trace_view)
        right.setStretchFactor(0, 3)
        right.setStretchFactor(1, 2)
        body = QSplitter(Qt.Orientation.Horizontal)
        body.addWidget(self.modules)
        body.addWidget(right)
        body.setSizes([440, 760])  # room for "model.layers.125" and the stage columns
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

        for combo in (self.cluster_combo, self.engine_combo, self.kv_combo, self.dtype_combo):
            combo.currentIndexChanged.connect(self._on_settings_changed)
        for spin in (self.context_spin, self.batch_spin):
            spin.valueChanged.connect(self._on_settings_changed)
        self.table.itemSelectionChanged.connect(self._on_table_selection_changed)
        self.export_button.clicked.connect(self._on_export_clicked)
        self.replan()

    def _layout_for(self, dtype: str) -> ModelLayout:
        """The model's layout with weights counted in ``dtype`` (built once per dtype)."""
        if dtype not in self._layouts:
            opened = self.opened if dtype == AS_STORED else self.opened.with_dtype(dtype)
            self._layouts[dtype] = ModelLayout.from_opened(opened)
        return self._layouts[dtype]

    def selected_candidate(self) -> Any:
        rows = self.table.selectionModel().selectedRows()
        if self.plan is None or not rows:
            return None
        return self.plan.candidates[rows[0].row()]

    def replan(self) -> None:
        """Plan with the current settings and show the best candidate."""
        cluster = self.clusters[self.cluster_combo.currentText()]
        try:
            self.layout_model = self._layout_for(self.dtype_combo.currentText())
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
            self._show(None)
            return
        self.table.blockSignals(True)
        self.table.setRowCount(len(self.plan.candidates))
        for row, c in enumerate(self.plan.candidates):
            peak = max(stage.total_bytes for stage in c.stages)
            partition = ",".join(map(str, c.layer_partition))
            cells = [
                c.label, str(c.gpus_used), "yes" if c.fits else "no",
                format_rate(c.decode_tokens_per_s), format_rate(c.pipelined_tokens_per_s),
                format_rate(c.prefill_tokens_per_s), format_nbytes(peak), partition,
            ]  # fmt: skip
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if 1 <= column <= 6:
                    item.setTextAlignment(
                        Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
                    )
                item.setToolTip(f"{c.label}: {len(c.stages)} stages, layers {partition}")
                self.table.setItem(row, column, item)
        self.table.blockSignals(False)
        if self.plan.candidates:
            self.table.selectRow(0)
        self._show(self.selected_candidate())

    def _show(self, candidate: Any) -> None:
        plan = self.plan
        self.lanes_widget.set_plan(plan.cluster if plan else None, candidate)
        self.modules.clear()
        self.export_button.setEnabled(candidate is not None and candidate.fits)
        self.candidate_shown.emit(candidate)
        if candidate is None:
            return
        for stage in candidate.stages:
            color = QBrush(stage_color(stage.index))
            group = QTreeWidgetItem(
                [
                    stage_words(stage),
                    f"stage {stage.index}",
                    format_nbytes(stage.total_bytes),
                ]
            )
            group.setBackground(1, color)
            group.setData(1, Qt.ItemDataRole.UserRole, stage.index)
            group.setToolTip(
                2,
                f"weights {format_nbytes(stage.weights_bytes)}, KV cache "
                f"{format_nbytes(stage.kv_cache_bytes)}, activations "
                f"{format_nbytes(stage.activation_bytes)}, engine "
                f"{format_nbytes(stage.overhead_bytes)}; budget {format_nbytes(stage.budget_bytes)}",
            )
            for name in stage.modules:
                item = QTreeWidgetItem([name, f"stage {stage.index}"])
                item.setBackground(1, color)
                item.setData(1, Qt.ItemDataRole.UserRole, stage.index)
                group.addChild(item)
            self.modules.addTopLevelItem(group)
            group.setExpanded(len(candidate.stages) <= 2)
        verdict = "fits" if candidate.fits else "does not fit"
        self.status_label.setText(
            f"{candidate.label} {verdict}: {format_rate(candidate.decode_tokens_per_s)} decode, "
            f"{format_rate(candidate.prefill_tokens_per_s)} prefill"
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
    bands = install_stage_bands(window.tree_panel)
    dialog = ClusterPlanDialog(
        opened,
        window,
        model_ref=hub_repo_id(str(opened.source)),
        dtype=window.planner_panel.dtype_combo.currentText(),  # the dtype the user plans in
    )
    cluster_name = dialog.cluster_combo.currentText
    dialog.candidate_shown.connect(lambda c: bands.set_candidate(c, cluster_name()))
    bands.set_candidate(dialog.selected_candidate(), cluster_name())
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.resize(1200, 760)
    dialog.show()
    return dialog
