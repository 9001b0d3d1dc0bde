"""Interactive inference tests on the dispatched model: stream, time, verify, remember.

Run sends the prompt to the worker; tokens stream into the output as they are generated, then
the panel shows time to first token, tokens/s (with the speed model's prediction beside them)
and the per-layer timing table of the last forward. Verify compares the dispatched model with
the same weights run undispatched and shows max abs/rel difference with a clear PASS/FAIL.
Every run lands in the history with the map it ran on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import (
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from workbench.gui.bridge import WorkerBridge
from workbench.gui.formatting import format_rate, format_seconds
from workbench.gui.plots import group_layer_timings
from workbench.gui.run_history import RunHistoryWidget, RunRecord
from workbench.runtime.protocol import (
    Failed,
    InferenceResult,
    LayerTiming,
    Result,
    TokenStreamed,
    VerifyResult,
)

logger = logging.getLogger(__name__)

LAYER_HEADERS = ("layer", "module", "from", "MiB", "transfer ms", "compute ms", "GB/s")


class InferencePanel(QWidget):
    """Prompt, max new tokens, Run / Verify / Stop, streamed output, figures, history.

    Args:
        bridge: the worker bridge.
        loaded_map: returns the device map of the loaded model (``None`` when nothing is).
        parent: Qt parent.

    Signals:
        run_finished(object): the ``RunRecord`` of a finished run (infer or verify).
    """

    run_finished = Signal(object)

    def __init__(
        self,
        bridge: WorkerBridge,
        loaded_map: Callable[[], dict[str, int | str] | None],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self._loaded_map = loaded_map
        self.request_id: int | None = None
        self.units: list[str] = []  # layer units the per-layer table folds modules into
        self.keep_module: Callable[[str], bool] | None = None  # drops labels not in the model
        self.current: RunRecord | None = None
        self._next_run_id = 1
        self._sent_s = 0.0

        self.prompt_edit = QPlainTextEdit(self)
        self.prompt_edit.setPlaceholderText("Prompt (empty: seeded random tokens)")
        self.prompt_edit.setPlainText("The quick brown fox")
        self.prompt_edit.setMaximumHeight(70)
        self.max_tokens_spin = QSpinBox(self)
        self.max_tokens_spin.setRange(1, 4096)
        self.max_tokens_spin.setValue(16)
        self.run_button = QPushButton("Run", self)
        self.verify_button = QPushButton("Verify", self)
        self.verify_button.setToolTip(
            "Compare the dispatched model's logits with the same weights run without dispatch"
        )
        self.stop_button = QPushButton("Stop", self)
        self.output_edit = QPlainTextEdit(self)
        self.output_edit.setReadOnly(True)
        self.output_edit.setPlaceholderText("Generated text streams here")
        self.ttft_label = QLabel("—", self)
        self.rate_label = QLabel("—", self)
        self.tokens_label = QLabel("—", self)
        self.verify_label = QLabel("not verified", self)
        self.verify_label.setObjectName("verifyLabel")
        self.verify_label.setTextFormat(Qt.TextFormat.RichText)
        self.status_label = QLabel("load a model to run it", self)
        self.layer_table = QTableWidget(0, len(LAYER_HEADERS), self)
        self.layer_table.setHorizontalHeaderLabels(list(LAYER_HEADERS))
        self.layer_table.verticalHeader().setVisible(False)
        self.layer_table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.history = RunHistoryWidget(self)
        self._build_layout()

        self.run_button.clicked.connect(self.run)
        self.verify_button.clicked.connect(self.verify)
        self.stop_button.clicked.connect(self.stop)
        bridge.token.connect(self._on_bridge_token)
        bridge.result.connect(self._on_bridge_result)
        bridge.failed.connect(self._on_bridge_failed)
        self.set_available(False)

    def _build_layout(self) -> None:
        controls = QHBoxLayout()
        controls.addWidget(QLabel("max new tokens", self))
        controls.addWidget(self.max_tokens_spin)
        controls.addWidget(self.run_button)
        controls.addWidget(self.verify_button)
        controls.addWidget(self.stop_button)
        controls.addStretch(1)
        figures = QFormLayout()
        figures.addRow("time to first token", self.ttft_label)
        figures.addRow("decode speed", self.rate_label)
        figures.addRow("tokens", self.tokens_label)
        figures.addRow("verify", self.verify_label)
        left = QWidget(self)
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(self.prompt_edit)
        left_layout.addLayout(controls)
        left_layout.addWidget(self.output_edit, 1)
        left_layout.addLayout(figures)
        left_layout.addWidget(self.status_label)
        self.side_tabs = QTabWidget(self)
        self.side_tabs.addTab(self.layer_table, "Per-layer timing")
        self.side_tabs.addTab(self.history, "Run history")
        splitter = QSplitter(Qt.Orientation.Horizontal, self)
        splitter.addWidget(left)
        splitter.addWidget(self.side_tabs)
        splitter.setStretchFactor(0, 1)
        splitter.setStretchFactor(1, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(splitter)

    # -- state ---------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.request_id is not None

    def set_available(self, available: bool) -> None:
        """Enable Run/Verify when a model is loaded and no run is in flight."""
        ready = available and not self.busy
        self.run_button.setEnabled(ready)
        self.verify_button.setEnabled(ready)
        self.stop_button.setEnabled(self.busy)
        if not available and not self.busy:
            self.status_label.setText("load a model to run it")
        elif ready and self.status_label.text() == "load a model to run it":
            self.status_label.setText("ready")

    # -- actions -------------------------------------------------------------------------
    def run(self) -> int | None:
        """Start an inference test with the prompt and max new tokens; return the request id."""
        prompt = self.prompt_edit.toPlainText().strip() or None
        max_new = self.max_tokens_spin.value()
        return self._start(
            "infer", prompt, lambda: self.bridge.infer(prompt, max_new_tokens=max_new)
        )

    def verify(self) -> int | None:
        """Start the equivalence check on the prompt; return the request id."""
        prompt = self.prompt_edit.toPlainText().strip() or None
        return self._start("verify", prompt, lambda: self.bridge.verify(prompt))

    def stop(self) -> None:
        """Cancel the run in flight (generation stops at the next token)."""
        if self.busy:
            self.bridge.cancel()
            self.status_label.setText("stopping…")

    def _start(self, kind: str, prompt: str | None, send: Callable[[], int]) -> int | None:
        device_map = self._loaded_map()
        if self.busy or device_map is None:
            return None
        try:
            request_id = send()
        except Exception as exc:  # not loaded any more, another job running
            self.status_label.setText(f"cannot {kind}: {exc}")
            return None
        self.request_id = request_id
        self._sent_s = time.monotonic()
        self.current = RunRecord(
            run_id=self._next_run_id,
            kind=kind,
            started_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
            device_map=dict(device_map),
            prompt=prompt,
            max_new_tokens=self.max_tokens_spin.value() if kind == "infer" else 0,
        )
        self._next_run_id += 1
        self.history.model.add(self.current)
        if kind == "infer":
            self.output_edit.clear()
            self.ttft_label.setText("…")
            self.rate_label.setText("…")
            self.tokens_label.setText("0")
        else:
            self.verify_label.setText("verifying…")
        self.status_label.setText(f"{kind} running…")
        self.set_available(True)
        return request_id

    # -- events --------------------------------------------------------------------------
    def _on_bridge_token(self, event: TokenStreamed) -> None:
        if event.request_id != self.request_id:
            return
        cursor = self.output_edit.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(event.text)
        self.output_edit.setTextCursor(cursor)
        self.tokens_label.setText(str(event.index + 1))
        if event.index == 0:
            self.ttft_label.setText(format_seconds(event.elapsed_s))

    def _on_bridge_result(self, event: Result) -> None:
        if event.request_id != self.request_id or self.current is None:
            return
        record, self.current, self.request_id = self.current, None, None
        record.status = "done"
        if isinstance(event.value, InferenceResult):
            self._show_inference(record, event.value)
        elif isinstance(event.value, VerifyResult):
            self._show_verify(record, event.value)
        self.history.model.update(record)
        self.status_label.setText(f"{record.kind} done")
        self.set_available(True)
        self.run_finished.emit(record)

    def _on_bridge_failed(self, event: Failed) -> None:
        if event.request_id != self.request_id or self.current is None:
            return
        record, self.current, self.request_id = self.current, None, None
        record.status = "cancelled" if event.kind == "cancelled" else "failed"
        self.history.model.update(record)
        self.status_label.setText(f"{record.kind} {record.status}: {event.message}")
        if record.kind == "verify":
            self.verify_label.setText(f"<b style='color:#b91c1c'>{record.status}</b>")
        self.set_available(self._loaded_map() is not None and event.kind != "worker_died")

    def _show_inference(self, record: RunRecord, value: InferenceResult) -> None:
        record.new_tokens = value.new_tokens
        record.ttft_s = value.ttft_s
        record.tokens_per_s = value.tokens_per_s
        record.total_s = value.total_s
        record.predicted = dict(value.predicted)
        layers = group_layer_timings(value.per_layer, self.units, keep=self.keep_module)
        record.per_layer = [_layer_dict(t) for t in layers]
        # generation can stop inside a multi-byte character: its bytes decode to a trailing
        # U+FFFD that is no character of the output, so neither the panel nor the record keep it
        record.text = value.text.rstrip("\ufffd")
        if record.text != self.output_edit.toPlainText():  # the stream holds back partial bytes
            self.output_edit.setPlainText(record.text)
        predicted_ttft = value.predicted.get("ttft_s")
        predicted_rate = value.predicted.get("tokens_per_s")
        self.ttft_label.setText(
            format_seconds(value.ttft_s)
            + ("" if predicted_ttft is None else f" (predicted {format_seconds(predicted_ttft)})")
        )
        self.rate_label.setText(
            format_rate(value.tokens_per_s)
            + ("" if predicted_rate is None else f" (predicted {format_rate(predicted_rate)})")
        )
        self.tokens_label.setText(f"{value.new_tokens} new, {value.prompt_tokens} in prompt")
        self.show_layers(layers)

    def _show_verify(self, record: RunRecord, value: VerifyResult) -> None:
        record.verify = {
            "passed": value.passed,
            "max_abs_diff": value.max_abs_diff,
            "max_rel_diff": value.max_rel_diff,
            "exact": value.exact,
            "reference": value.reference,
        }
        verdict = "PASS" if value.passed else "FAIL"
        color = "#15803d" if value.passed else "#b91c1c"
        exact = " (bitwise identical)" if value.exact else ""
        self.verify_label.setText(
            f"<b style='color:{color}'>{verdict}</b> max |abs| {value.max_abs_diff:.3g} · "
            f"max rel {value.max_rel_diff:.3g}{exact}"
        )
        self.verify_label.setToolTip(f"reference: {value.reference}")

    def show_layers(self, per_layer: tuple[LayerTiming, ...] | list[LayerTiming]) -> None:
        """Fill the per-layer table with one forward's figures."""
        self.layer_table.setRowCount(len(per_layer))
        for row, timing in enumerate(per_layer):
            cells = (
                str(row),
                timing.module,
                timing.source or "resident",
                f"{timing.nbytes / 2**20:.1f}",
                f"{timing.transfer_s * 1e3:.2f}",
                f"{timing.compute_s * 1e3:.2f}",
                f"{timing.gbps:.2f}" if timing.nbytes else "",
            )
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if column not in (1, 2):
                    item.setTextAlignment(
                        Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
                    )
                self.layer_table.setItem(row, column, item)
        self.layer_table.resizeColumnsToContents()


def _layer_dict(timing: Any) -> dict[str, Any]:
    return {
        "module": timing.module,
        "source": timing.source,
        "nbytes": timing.nbytes,
        "transfer_s": timing.transfer_s,
        "compute_s": timing.compute_s,
    }
