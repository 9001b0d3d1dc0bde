"""The Inference tab's "Memory" table: predicted beside measured bytes per device.

After each load and each inference run the worker measures what every device holds (see
``workbench.runtime.memory_record``); ``MemoryReconcileWidget`` shows the latest record as a
table (a column per device; rows: predicted weights, measured weights, predicted total,
measured, error, read from disk), logs it as one line (the Log tab), and emits
``record_shown`` so the lanes can put the measured figures in their tooltips. After a load
the Inference tab shows this table (no run has filled the per-layer one yet).

Example:
    >>> view = MemoryReconcileWidget(bridge)  # doctest: +SKIP
    >>> view.record_shown.connect(lanes.show_measured)
"""

from __future__ import annotations

import logging

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHeaderView,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from workbench.gui.bridge import WorkerBridge
from workbench.runtime.formatting import format_nbytes
from workbench.runtime.memory_record import TABLE_COLUMNS, DeviceMemory, MemoryReconciliation
from workbench.runtime.protocol import InferenceResult, LoadSummary, Result

logger = logging.getLogger(__name__)

NO_RECORD = "no load measured yet: Load & dispatch, then Run"
FIGURES = TABLE_COLUMNS[1:]  # the table's rows; its columns are the devices
EXPLANATION = (
    "Predicted: the weights the map places on each device, plus for a run the memory model's "
    "KV cache and activation peak at the run's tokens and the largest offloaded block.\n"
    "Measured: what stays resident after a load, the peak during a run. CUDA: the allocator; "
    "CPU: the anonymous RSS the load added once the empty model and the tokenizer were built, "
    "plus weights memory-mapped from files (the runtime overhead before the tensors is in the "
    "notes, in no total); disk: the offload files, and the bytes read."
)
_NUMERIC = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter


class MemoryReconcileWidget(QWidget):
    """The latest predicted-vs-measured record of the loaded model, as a table.

    Args:
        bridge: the worker bridge whose load and infer results carry the records.
        parent: Qt parent.

    Attributes:
        record: the record shown, or ``None``.
        device_map: the map of the model the record was measured on.

    Signals:
        record_shown(object, object): ``(record, device_map)`` after each new record;
            ``(None, None)`` once the model it was measured on is no longer loaded.
    """

    record_shown = Signal(object, object)

    def __init__(self, bridge: WorkerBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("memoryReconcileView")
        self.record: MemoryReconciliation | None = None
        self.device_map: dict[str, int | str] | None = None
        self._loaded_map: dict[str, int | str] | None = None
        self.caption = QLabel(NO_RECORD, self)
        # one line, cut when narrow (whole in the tooltip): the panel must fit a short dock
        self.caption.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        # one column per device, one row per figure: a few devices fit the narrow side of the
        # Inference tab, where seven figure columns would not
        self.table = QTableWidget(len(FIGURES), 0, self)
        self.table.setObjectName("memoryReconcileTable")
        self.table.setVerticalHeaderLabels(list(FIGURES))
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().lineSpacing() + 6)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectColumns)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.notes = QLabel("", self)
        self.notes.setWordWrap(True)
        self.notes.setVisible(False)
        self.caption.setToolTip(EXPLANATION)
        # every figure row shows first and the notes follow; in a short dock the two scroll
        # together (the table scrolled inside itself, behind notes of fixed height: 4 of its
        # 6 rows showed in the first-run window)
        content = QWidget(self)
        content_layout = QVBoxLayout(content)
        content_layout.setContentsMargins(0, 0, 0, 0)
        content_layout.setSpacing(3)
        content_layout.addWidget(self.table)
        content_layout.addWidget(self.notes)
        content_layout.addStretch(1)
        self.scroll = QScrollArea(self)
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setWidget(content)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.setSpacing(3)
        layout.addWidget(self.caption)
        layout.addWidget(self.scroll, 1)
        self._fit_table_height()
        bridge.result.connect(self._on_bridge_result)
        bridge.state_changed.connect(self._on_bridge_state_changed)

    def show_record(
        self, record: MemoryReconciliation, device_map: dict[str, int | str] | None
    ) -> None:
        """Show ``record`` (measured on ``device_map``), log it and emit ``record_shown``."""
        self.record, self.device_map = record, device_map
        what = "after the load" if record.job == "load" else "during the last run"
        if record.context_tokens:
            what += f" ({record.context_tokens} tokens of context)"
        self.caption.setText(f"Predicted against measured memory {what}")
        self.caption.setToolTip(
            f"{self.caption.text()}\n\n{EXPLANATION}\n\nHover a device for how."
        )
        rows = record.table_rows()
        self.table.setColumnCount(len(rows))
        self.table.setHorizontalHeaderLabels([texts[0] for texts in rows])
        for column, (texts, device) in enumerate(zip(rows, record.devices, strict=True)):
            tip = _row_tooltip(device)
            self.table.horizontalHeaderItem(column).setToolTip(tip)
            for row_index, text in enumerate(texts[1:]):
                item = QTableWidgetItem(text)
                item.setTextAlignment(_NUMERIC)
                item.setToolTip(tip)
                self.table.setItem(row_index, column, item)
        self.notes.setText("\n".join(record.notes))
        self.notes.setVisible(bool(record.notes))
        self._fit_table_height()
        logger.info("%s", record.describe())
        self.record_shown.emit(record, device_map)

    def _fit_table_height(self) -> None:
        """The table as tall as its header and rows (and its sideways scroll bar, which a
        wide map's columns bring): the scroll area around it scrolls, not the table."""
        table = self.table
        height = (
            table.horizontalHeader().sizeHint().height()
            + table.verticalHeader().length()
            + 2 * table.frameWidth()
            + table.horizontalScrollBar().sizeHint().height()
        )
        table.setFixedHeight(height)

    def _on_bridge_result(self, event: Result) -> None:
        value = event.value
        if event.job == "load" and isinstance(value, LoadSummary):
            self._loaded_map = dict(value.device_map)
            if value.memory is not None:
                self.show_record(value.memory, self._loaded_map)
        elif isinstance(value, InferenceResult) and value.memory is not None:
            self.show_record(value.memory, self._loaded_map)

    def _on_bridge_state_changed(self, state: str) -> None:
        if state not in ("idle", "stopped") or self._loaded_map is None:
            return
        self._loaded_map = None  # the worker holds no model: the lanes' figures are stale
        if self.record is not None:
            # first: the caption is cut at the panel's width, and this is what it must say
            self.caption.setText("That model is no longer loaded — " + self.caption.text())
            self.caption.setToolTip(f"{self.caption.text()}\n\n{EXPLANATION}")
        self.record_shown.emit(None, None)


def _row_tooltip(row: DeviceMemory) -> str:  # one device's column
    """How ``row`` was measured, with the whole-process figures behind it."""
    lines = [f"{row.device}: {row.how}" if row.how else row.device]
    lines.append(
        f"predicted {format_nbytes(row.predicted_bytes)} = weights "
        f"{format_nbytes(row.predicted_weights_bytes)} + KV cache and activations "
        f"{format_nbytes(row.predicted_reserve_bytes)}"
    )
    if row.rest_bytes is not None:
        lines.append(f"measured besides the weights: {format_nbytes(row.rest_bytes)}")
    if row.device == "cpu" and row.process_bytes is not None:
        lines.append(
            f"worker anonymous RSS {format_nbytes(row.process_bytes)}, of which "
            f"{format_nbytes(row.baseline_bytes)} was there before the tensors loaded"
        )
        if row.runtime_bytes is not None:
            lines.append(
                f"runtime overhead (imports, empty model, tokenizer), in no total: "
                f"{format_nbytes(row.runtime_bytes)}"
            )
    elif row.process_bytes is not None:
        lines.append(f"allocated at the end: {format_nbytes(row.process_bytes)}")
    if row.read_bytes:
        lines.append(f"read from disk: {format_nbytes(row.read_bytes)}")
    return "\n".join(lines)
