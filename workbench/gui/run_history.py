"""The history of inference and verify runs, each with the device map it ran on.

Selecting two runs shows how their maps differ, so a user can see what a map change bought.
The history exports as JSON (atomically).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from workbench.gui import settings as app_settings
from workbench.gui.colors import pass_color
from workbench.gui.plots import show_export_error
from workbench.runtime import atomic_write_text
from workbench.runtime.formatting import format_rate, format_seconds
from workbench.runtime.run_records import RunRecord, map_diff, map_summary
from workbench.wording import plural

HISTORY_FORMAT = "workbench-run-history"

_Index = QModelIndex | QPersistentModelIndex


class RunHistoryModel(QAbstractTableModel):
    """Table of ``RunRecord`` rows: #, kind, map, tok/s, TTFT, result."""

    HEADERS = ("#", "kind", "map", "tok/s", "TTFT", "result", "predicted")
    HEADER_TIPS = (
        "Run number",
        "infer: a generation run; verify: the equivalence check",
        "The device map the run ran on: a short id (same id, same map) and the number of "
        "modules per device; hover a row for the whole map, select two runs to compare them",
        "Decode speed: tokens per second after the first token (of a stopped run: until the stop)",
        "Time to first token",
        "The outcome: tokens generated, PASS/FAIL, stopped or failed",
        "The speed model's tok/s and TTFT for the same map on the hardware the run ran on "
        "(this machine), beside the measured ones",
    )

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.records: list[RunRecord] = []

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.records)

    def columnCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.HEADERS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = 0) -> Any:
        if orientation != Qt.Orientation.Horizontal:
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return self.HEADERS[section]
        if role == Qt.ItemDataRole.ToolTipRole:
            return self.HEADER_TIPS[section]
        return None

    def data(self, index: _Index, role: int = 0) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self.records):
            return None
        record = self.records[index.row()]
        column = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._display(record, column)
        if role == Qt.ItemDataRole.ToolTipRole and column == 2:
            return "\n".join(
                f"{k or '(whole model)'}: {v}" for k, v in sorted(record.device_map.items())
            )
        if role == Qt.ItemDataRole.ToolTipRole and column in (3, 4) and record.status == "stopped":
            return (
                f"measured over the {plural(record.new_tokens, 'token')} generated before the stop"
            )
        if role == Qt.ItemDataRole.ForegroundRole and column == 5 and record.verify is not None:
            return pass_color(bool(record.verify.get("passed")))
        return None

    @staticmethod
    def _display(record: RunRecord, column: int) -> str:
        if column == 0:
            return str(record.run_id)
        if column == 1:
            return record.kind
        if column == 2:
            return f"{record.map_id} ({map_summary(record.device_map)})"
        missing = "—" if record.kind == "infer" and record.status != "running" else ""
        if column == 3:
            return missing if record.tokens_per_s is None else format_rate(record.tokens_per_s)
        if column == 4:
            return missing if record.ttft_s is None else format_seconds(record.ttft_s)
        if column == 6 and record.one_forward:
            forward = record.predicted.get("forward_s")
            return missing if forward is None else f"forward {format_seconds(forward)}"
        if column == 6:
            rate, ttft = record.predicted.get("tokens_per_s"), record.predicted.get("ttft_s")
            if rate is None or ttft is None:
                return missing
            return f"{format_rate(rate)} · {format_seconds(ttft)}"
        if record.verify is not None and record.status == "done":
            verdict = "PASS" if record.verify.get("passed") else "FAIL"
            return f"{verdict} (max abs {record.verify.get('max_abs_diff', 0):.3g})"
        tokens = f"{record.new_tokens} token" + ("" if record.new_tokens == 1 else "s")
        if record.kind == "infer" and record.status == "done":
            return "one forward" if record.one_forward else tokens
        if record.kind == "infer" and record.status == "stopped":
            return f"stopped after {tokens}"
        return record.status

    def add(self, record: RunRecord) -> int:
        """Append ``record``; return its row."""
        row = len(self.records)
        self.beginInsertRows(QModelIndex(), row, row)
        self.records.append(record)
        self.endInsertRows()
        return row

    def update(self, record: RunRecord) -> None:
        """Refresh the row of ``record`` after its fields changed."""
        row = self.records.index(record)
        self.dataChanged.emit(self.index(row, 0), self.index(row, self.columnCount() - 1))

    def to_json(self) -> str:
        return json.dumps(
            {"format": HISTORY_FORMAT, "version": 1, "runs": [r.to_dict() for r in self.records]},
            indent=2,
            sort_keys=True,
        )

    def export_json(self, path: str | Path) -> Path:
        """Write every run as JSON to ``path`` atomically and return the path."""
        atomic_write_text(path, self.to_json())
        return Path(path)


class RunHistoryWidget(QWidget):
    """The history table, Export JSON…, and the map of the selected run (or the diff of two)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = RunHistoryModel(self)
        self.view = QTableView(self)
        self.view.setModel(self.model)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.view.verticalHeader().setVisible(False)
        self.view.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.view.horizontalHeader().setStretchLastSection(True)
        self.details = QPlainTextEdit(self)
        self.details.setReadOnly(True)
        self.details.setPlaceholderText("Select a run to see its map, or two runs to compare maps")
        lines = self.fontMetrics().lineSpacing()
        self.view.setMinimumHeight(3 * lines + 12)  # the header and two rows: fits a short dock
        self.details.setMinimumHeight(2 * lines + 10)
        self.export_button = QPushButton("Export JSON…", self)
        self.path_chooser = self._ask_path
        self.last_error_box: QMessageBox | None = None
        top = QHBoxLayout()
        top.addWidget(QLabel("<b>Runs</b>", self))
        top.addStretch(1)
        top.addWidget(self.export_button)
        splitter = QSplitter(Qt.Orientation.Vertical, self)
        splitter.addWidget(self.view)
        splitter.addWidget(self.details)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(splitter, 1)
        self.export_button.clicked.connect(self._on_export_clicked)
        self.view.selectionModel().selectionChanged.connect(self._on_view_selection_changed)

    def selected_records(self) -> list[RunRecord]:
        rows = sorted({index.row() for index in self.view.selectionModel().selectedRows()})
        return [self.model.records[row] for row in rows]

    def _on_view_selection_changed(self, *_: object) -> None:
        records = self.selected_records()
        if len(records) == 1:
            record = records[0]
            lines = [f"run {record.run_id} ({record.kind}) on map {record.map_id}:"]
            lines += [
                f"  {k or '(whole model)'}: {v}" for k, v in sorted(record.device_map.items())
            ]
            lines += [f"{k}: {v}" for k, v in record.settings.items()]  # mode, sampling, ...
            self.details.setPlainText("\n".join(lines))
        elif len(records) == 2:
            first, second = records
            diff = map_diff(first.device_map, second.device_map)
            head = f"run {first.run_id} (map {first.map_id}) vs run {second.run_id} (map {second.map_id})"
            speed = ""
            if first.tokens_per_s and second.tokens_per_s:
                speed = f"\ntok/s: {first.tokens_per_s:.3g} vs {second.tokens_per_s:.3g} ({second.tokens_per_s / first.tokens_per_s:.2f}x)"
            body = "\n".join(f"  {line}" for line in diff) if diff else "  same map"
            self.details.setPlainText(f"{head}{speed}\n{body}")
        else:
            self.details.clear()

    def _on_export_clicked(self) -> None:
        path = self.path_chooser("Export run history", "JSON files (*.json)")
        if path:
            try:
                self.model.export_json(path)
            except OSError as exc:
                self.last_error_box = show_export_error(self, path, exc)

    def _ask_path(self, title: str, file_filter: str) -> str | None:
        start = str(app_settings.dialog_folder("runs") / "runs.json")
        path, _ = QFileDialog.getSaveFileName(self, title, start, file_filter)
        if path:
            app_settings.remember_dialog_folder("runs", path)
        return path or None
