"""Interactive inference tests on the dispatched model: stream, time, verify, remember.

Run sends the prompt to the worker; tokens stream into the output as they are generated, then
the panel shows time to first token, tokens/s (with the speed model's prediction beside them)
and the per-layer timing table of the last forward. Verify compares the dispatched model with
the same weights run undispatched and shows max abs/rel difference with a clear PASS/FAIL.
Every run lands in the history with the map it ran on. A stopped or failed run keeps the
figures measured from its streamed tokens, and the per-layer table says which run it shows.
Ctrl+Enter in the prompt runs. Each result and each stop is logged (``workbench.*`` loggers
feed the Log tab).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QKeyEvent, QTextCursor
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from workbench.gui.bridge import WorkerBridge
from workbench.gui.formatting import format_bandwidth, format_nbytes, format_rate, format_seconds
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

LAYER_HEADERS = ("layer", "module", "from", "size", "transfer ms", "compute ms", "rate")
LAYER_HEADER_TIPS = (
    "Position of the layer in the forward pass",
    "The module (one layer, its submodules folded in)",
    "Where the layer's weights came from: resident (already on the execution device), "
    "or the device they were copied from (cpu, disk)",
    "Weight bytes copied to the execution device, in binary units (1 KiB = 2^10 bytes, "
    "1 MiB = 2^20 bytes)",
    "Time spent copying the weights to the execution device, in milliseconds",
    "Time of the layer's own computation, in milliseconds",
    "Copy throughput in decimal units (1 GB/s = 10^9 bytes per second, 1 MB/s = 10^6): "
    "bytes copied / transfer time",
)


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
        self._streamed: list[float] = []  # elapsed seconds of each token of the run in flight
        self._layers_run: int | None = None  # the run the per-layer table shows
        self._failure_shown = False  # the status line tells why the last run did not finish

        lines = self.fontMetrics().lineSpacing()
        self.prompt_edit = QPlainTextEdit(self)
        self.prompt_edit.setPlaceholderText("Prompt (empty: seeded random tokens)")
        self.prompt_edit.setPlainText("The quick brown fox")
        self.prompt_edit.setToolTip("The prompt; Ctrl+Enter runs it")
        self.prompt_edit.setMinimumHeight(2 * lines + 10)
        self.prompt_edit.setMaximumHeight(3 * lines + 10)
        self.prompt_edit.installEventFilter(self)
        self.max_tokens_spin = QSpinBox(self)
        self.max_tokens_spin.setRange(1, 4096)
        self.max_tokens_spin.setValue(16)
        self.max_tokens_spin.setToolTip(
            "The most tokens a run generates after the prompt (Stop ends a run sooner)"
        )
        self.run_button = QPushButton("Run", self)
        self.run_button.setToolTip(
            "Generate up to max new tokens from the prompt on the loaded model (Ctrl+Enter)"
        )
        self.verify_button = QPushButton("Verify", self)
        self.verify_button.setToolTip(
            "Compare the dispatched model's logits with the same weights run without dispatch"
        )
        self.stop_button = QPushButton("Stop", self)
        self.stop_button.setToolTip(
            "Stop the run in flight after the current token; the figures so far are kept"
        )
        self.output_edit = QPlainTextEdit(self)
        self.output_edit.setReadOnly(True)
        self.output_edit.setPlaceholderText("Generated text streams here")
        self.output_edit.setMinimumHeight(2 * lines + 10)
        self.ttft_label = QLabel("—", self)
        self.rate_label = QLabel("—", self)
        self.tokens_label = QLabel("—", self)
        self.verify_label = QLabel("not verified", self)
        self.verify_label.setObjectName("verifyLabel")
        self.verify_label.setTextFormat(Qt.TextFormat.RichText)
        self.status_label = QLabel("load a model to run it", self)
        # a long failure message must not widen the panel: it is cut, and whole in the tooltip
        self.status_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.layer_caption = QLabel("no finished run yet", self)
        self.layer_table = QTableWidget(0, len(LAYER_HEADERS), self)
        self.layer_table.setHorizontalHeaderLabels(list(LAYER_HEADERS))
        for column, tip in enumerate(LAYER_HEADER_TIPS):
            self.layer_table.horizontalHeaderItem(column).setToolTip(tip)
        self.layer_table.verticalHeader().setVisible(False)
        self.layer_table.verticalHeader().setDefaultSectionSize(lines + 6)
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
        max_tokens_label = QLabel("max new tokens", self)
        max_tokens_label.setToolTip(self.max_tokens_spin.toolTip())
        controls = QHBoxLayout()
        controls.addWidget(max_tokens_label)
        controls.addWidget(self.max_tokens_spin)
        controls.addWidget(self.run_button)
        controls.addWidget(self.verify_button)
        controls.addWidget(self.stop_button)
        controls.addWidget(self.status_label, 1)  # beside the buttons: one line less to fit
        figures = QGridLayout()  # two rows of two figures: the panel fits a short dock
        figures.setVerticalSpacing(2)
        for position, (title, label) in enumerate(
            (
                ("time to first token", self.ttft_label),
                ("decode speed", self.rate_label),
                ("tokens", self.tokens_label),
                ("verify", self.verify_label),
            )
        ):
            row, column = divmod(position, 2)
            label.setWordWrap(True)  # long figures wrap instead of widening the panel
            figures.addWidget(QLabel(title, self), row, 2 * column)
            figures.addWidget(label, row, 2 * column + 1)
        figures.setColumnStretch(1, 1)
        figures.setColumnStretch(3, 1)
        left = QWidget(self)
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.setSpacing(4)
        left_layout.addWidget(self.prompt_edit)
        left_layout.addLayout(controls)
        left_layout.addWidget(self.output_edit, 1)
        left_layout.addLayout(figures)
        layers = QWidget(self)
        layers_layout = QVBoxLayout(layers)
        layers_layout.setContentsMargins(2, 2, 2, 2)
        layers_layout.setSpacing(2)
        layers_layout.addWidget(self.layer_caption)
        layers_layout.addWidget(self.layer_table, 1)
        self.side_tabs = QTabWidget(self)
        self.side_tabs.addTab(layers, "Per-layer timing")
        self.side_tabs.addTab(self.history, "Run history")
        splitter = QSplitter(Qt.Orientation.Horizontal, self)
        splitter.addWidget(left)
        splitter.addWidget(self.side_tabs)
        splitter.setStretchFactor(0, 1)
        splitter.setStretchFactor(1, 1)
        # in a dock shorter than the panel's minimum, the panel scrolls instead of holding the
        # dock tall
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(splitter)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(scroll)

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
            # a failure stays readable after the model goes away (the worker died, say)
            failed = self._failure_shown and not self.status_label.text().startswith("load a")
            self._show_status(
                f"{self.status_label.text()}; load a model to run it"
                if failed
                else "load a model to run it"
            )
            self._failure_shown = False
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
            self._show_status(f"cannot {kind}: {exc}")
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
            self._streamed = []
            self.output_edit.clear()
            self.ttft_label.setText("…")
            self.rate_label.setText("…")
            self.tokens_label.setText("0")
            self._caption_layers(f"run {self.current.run_id} running…")
        else:
            self.verify_label.setText("verifying…")
        self._show_status(f"{kind} running…")
        self._failure_shown = False
        self.set_available(True)
        return request_id

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """Ctrl+Enter in the prompt runs (when Run is enabled) instead of adding a line."""
        if (
            watched is self.prompt_edit
            and event.type() == QEvent.Type.KeyPress
            and isinstance(event, QKeyEvent)
            and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
            and event.modifiers() & Qt.KeyboardModifier.ControlModifier
        ):
            if self.run_button.isEnabled():
                self.run()
            return True
        return super().eventFilter(watched, event)

    # -- events --------------------------------------------------------------------------
    def _on_bridge_token(self, event: TokenStreamed) -> None:
        if event.request_id != self.request_id:
            return
        cursor = self.output_edit.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(event.text)
        self.output_edit.setTextCursor(cursor)
        self.tokens_label.setText(str(event.index + 1))
        self._streamed.append(event.elapsed_s)
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
        self._show_status(f"{record.kind} done")
        logger.info("%s", _outcome(record))
        self.set_available(True)
        self.run_finished.emit(record)

    def _on_bridge_failed(self, event: Failed) -> None:
        if event.request_id != self.request_id or self.current is None:
            return
        record, self.current, self.request_id = self.current, None, None
        record.status = "stopped" if event.kind == "cancelled" else "failed"
        # the worker's message may already name the job ("infer cancelled: …"): say it once
        reason = re.sub(rf"^{record.kind} (cancelled|failed): ", "", event.message or "")
        message = reason if reason.startswith(record.kind) else f"{record.kind} {record.status}"
        message += f": {reason}" if reason and message != reason else ""
        if record.kind == "infer":
            self._keep_partial(record)
            message += f" ({_plural(record.new_tokens, 'token')} generated)"
            self._caption_layers(f"run {record.run_id} {record.status}, no timings")
        else:
            self.verify_label.setText(f"<b style='color:#b91c1c'>{record.status}</b>")
        self.history.model.update(record)
        self._show_status(message, event.details)
        self._failure_shown = True
        logger.info("%s", _outcome(record, reason))
        self.set_available(self._loaded_map() is not None and event.kind != "worker_died")

    def _keep_partial(self, record: RunRecord) -> None:
        """Put the figures of the tokens streamed before a stop into the labels and ``record``."""
        streamed = self._streamed
        record.new_tokens = len(streamed)
        record.text = self.output_edit.toPlainText()
        record.ttft_s = streamed[0] if streamed else None
        if len(streamed) > 1 and streamed[-1] > streamed[0]:
            record.tokens_per_s = (len(streamed) - 1) / (streamed[-1] - streamed[0])
        self.ttft_label.setText("—" if record.ttft_s is None else format_seconds(record.ttft_s))
        self.rate_label.setText(
            "—"
            if record.tokens_per_s is None
            else f"{format_rate(record.tokens_per_s)} (until {record.status})"
        )
        self.tokens_label.setText(f"{record.new_tokens} new ({record.status})")

    def _show_status(self, text: str, details: str = "") -> None:
        self.status_label.setText(text)
        self.status_label.setToolTip(f"{text}\n\n{details}" if details else text)

    def _caption_layers(self, note: str = "") -> None:
        """Say which run the per-layer table shows; ``note`` tells about the latest run."""
        if self._layers_run is None:
            text = note or "no finished run yet"
        elif note:
            text = f"from run {self._layers_run} (previous run); {note}"
        else:
            text = f"last forward of run {self._layers_run}"
        self.layer_caption.setText(text)

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
        self._layers_run = record.run_id
        self._caption_layers()

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
                format_nbytes(timing.nbytes) if timing.nbytes else "",
                f"{timing.transfer_s * 1e3:.2f}",
                f"{timing.compute_s * 1e3:.2f}",
                format_bandwidth(timing.nbytes / timing.transfer_s)
                if timing.nbytes and timing.transfer_s > 0
                else "",
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


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _outcome(record: RunRecord, reason: str = "") -> str:
    """One log line for a finished, stopped or failed run."""
    head = f"{record.kind} run {record.run_id} (map {record.map_id})"
    if record.verify is not None and record.status == "done":
        verdict = "PASS" if record.verify["passed"] else "FAIL"
        return (
            f"{head}: {verdict}, max abs diff {record.verify['max_abs_diff']:.3g}, "
            f"max rel diff {record.verify['max_rel_diff']:.3g}"
        )
    figures = ""
    if record.kind == "infer":
        rate = "— tok/s" if record.tokens_per_s is None else format_rate(record.tokens_per_s)
        ttft = "—" if record.ttft_s is None else format_seconds(record.ttft_s)
        figures = f"{_plural(record.new_tokens, 'token')}, {rate}, TTFT {ttft}"
    if record.status == "done":
        return f"{head}: {figures}"
    why = f": {reason}" if reason else ""
    return f"{head} {record.status}{why}" + (f"; {figures}" if figures else "")
