"""Interactive inference tests on the dispatched model: chat, stream, time, verify, remember.

Two modes: Chat (a system prompt and the turns so far, built into the prompt with the model's
chat template, or plain role lines when it has none; the answer ends at the end-of-turn token)
and Raw prompt (the text is continued as it is). A model with a chat template opens in Chat,
others in Raw prompt. The Sampling tab chooses greedy or sampled decoding (temperature, top-p,
top-k, seed) and a repetition penalty; each run's settings go into the run history with its
figures. Run sends the request to the worker; tokens stream in as they are generated, then
the panel shows time to first token, tokens/s (with the speed model's prediction for this
machine beside them) and the per-layer timing table of the last forward. Verify compares the
dispatched model with the same weights run undispatched: max abs/rel difference of the logits
with a clear PASS/FAIL, and the greedy continuation compared token by token.
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
from html import escape
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QKeyEvent, QTextCursor
from PySide6.QtWidgets import (
    QComboBox,
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
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from workbench.gui.bridge import WorkerBridge
from workbench.gui.chat_view import ChatView
from workbench.gui.colors import FAIL_HEX
from workbench.gui.elided_label import ElidedLabel
from workbench.gui.inference_figures import (
    STOP_REASONS,
    figures_with_predictions,
    fill_layer_table,
    layer_dict,
    make_layer_table,
    no_text_note,
    outcome,
    verify_record,
    verify_summary,
)
from workbench.gui.memory_reconcile_view import MemoryReconcileWidget
from workbench.gui.plots import group_layer_timings
from workbench.gui.run_history import RunHistoryWidget
from workbench.gui.sampling_controls import SamplingControls
from workbench.runtime.formatting import format_rate, format_seconds
from workbench.runtime.protocol import (
    PROBING_HOST,
    PROBING_WORKSPACE,
    Failed,
    InferenceResult,
    LayerTiming,
    LoadSummary,
    Phase,
    Result,
    TokenStreamed,
    VerifyResult,
)
from workbench.runtime.run_records import RunRecord
from workbench.runtime.sampling import describe_sampling, sampling_dict
from workbench.wording import plural

logger = logging.getLogger(__name__)
TTFT_TITLE = "time to first token"
FORWARD_TITLE = "forward time"  # a model that generates nothing: one forward

CHAT, RAW = "chat", "raw"
MODE_LABELS = {CHAT: "Chat", RAW: "Raw prompt"}
RAW_DEFAULT_PROMPT = "The quick brown fox"
CHAT_DEFAULT_MESSAGE = "What is the capital of France?"
VERIFY_GREEDY_TOKENS = 16  # verify also compares this many greedy tokens, one by one
_PROBING_TEXT = {  # what the worker measures after a run's timed part, once, before its result
    PROBING_HOST: (
        "measuring this machine…",
        "Measuring this machine's cost per module call and its CPU matmul speed, for the "
        "predicted figures: once per machine, about fifteen seconds, in fresh processes.",
    ),
    PROBING_WORKSPACE: (
        "measuring matmul memory…",
        "Measuring the memory the CPU's matmul libraries keep after this run's matmul shapes, "
        "for the memory record: once per prompt length, about a second, in a fresh process.",
    ),
}


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
        # the run in flight was started for a model no longer on screen: its verdict is logged
        # and kept in the history, not shown as the current one
        self._stale = False

        lines = self.fontMetrics().lineSpacing()
        self.prompt_edit = QPlainTextEdit(self)
        self.prompt_edit.setPlaceholderText("Prompt (empty: seeded random tokens)")
        self.prompt_edit.setPlainText(RAW_DEFAULT_PROMPT)
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
        self.output_edit.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
        self.ttft_label = QLabel("—", self)
        self.rate_label = QLabel("—", self)
        self.tokens_label = QLabel("—", self)
        self.verify_label = QLabel("not verified", self)
        self.verify_label.setObjectName("verifyLabel")
        self.verify_label.setTextFormat(Qt.TextFormat.RichText)
        self.status_label = ElidedLabel("load a model to run it", self)
        # a long failure message must not widen the panel: its start shows, whole in the tooltip
        self.status_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.status_label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.layer_caption = QLabel("no finished run yet", self)
        self.layer_table = make_layer_table(self, row_height=lines + 6)
        self.history = RunHistoryWidget(self)
        self.memory_view = MemoryReconcileWidget(bridge, self)  # predicted vs measured bytes
        self.loaded_label = QLabel("Runs on: no model loaded", self)
        self.loaded_label.setObjectName("loadedModelLabel")
        self.loaded_label.setWordWrap(True)
        self.mode_combo = QComboBox(self)
        for mode in (CHAT, RAW):
            self.mode_combo.addItem(MODE_LABELS[mode], mode)
        self.mode_combo.setCurrentIndex(1)  # raw until a model with a chat template loads
        self.mode_combo.setToolTip(
            "Chat: a conversation (system prompt, turns) built with the model's chat template; "
            "Raw prompt: the text is continued as it is"
        )
        self.new_chat_button = QPushButton("New chat", self)
        self.new_chat_button.setToolTip("Forget the turns so far (the system prompt stays)")
        self.chat_view = ChatView(self)
        self.sampling_controls = SamplingControls(self)
        self.loaded_summary: LoadSummary | None = None
        self._answer = ""  # the text streamed by the run in flight
        self._chat_turn = False  # the run in flight is a chat turn
        self._build_layout()

        self.run_button.clicked.connect(self.run)
        self.mode_combo.currentIndexChanged.connect(self._on_mode_combo_changed)
        self.new_chat_button.clicked.connect(self.chat_view.clear)
        self.sampling_controls.changed.connect(self._on_sampling_controls_changed)
        self.verify_button.clicked.connect(self.verify)
        self.stop_button.clicked.connect(self.stop)
        bridge.token.connect(self._on_bridge_token)
        bridge.phase.connect(self._on_bridge_phase)
        bridge.result.connect(self._on_bridge_result)
        bridge.failed.connect(self._on_bridge_failed)
        self._on_mode_combo_changed()
        self._on_sampling_controls_changed()
        self.set_available(False)

    def _build_layout(self) -> None:
        max_tokens_label = QLabel("max new tokens", self)
        max_tokens_label.setToolTip(self.max_tokens_spin.toolTip())
        controls = QHBoxLayout()
        controls.addWidget(self.mode_combo)
        controls.addWidget(max_tokens_label)
        controls.addWidget(self.max_tokens_spin)
        controls.addWidget(self.run_button)
        controls.addWidget(self.verify_button)
        controls.addWidget(self.stop_button)
        controls.addWidget(self.new_chat_button)
        controls.addStretch(1)
        # the status sits beside "Runs on:", where it has the room to show whole
        top = QHBoxLayout()
        top.addWidget(self.loaded_label, 1)
        top.addWidget(self.status_label, 1)
        figures = QGridLayout()  # two rows of two figures: the panel fits a short dock
        figures.setVerticalSpacing(2)
        # "forward time" for a model that generates nothing (its run is one forward)
        self.ttft_title = QLabel(TTFT_TITLE, self)
        for position, (title, label) in enumerate(
            (
                (self.ttft_title, self.ttft_label),
                ("decode speed", self.rate_label),
                ("tokens", self.tokens_label),
                ("verify", self.verify_label),
            )
        ):
            row, column = divmod(position, 2)
            label.setWordWrap(True)  # long figures wrap instead of widening the panel
            title_label = title if isinstance(title, QLabel) else QLabel(title, self)
            figures.addWidget(title_label, row, 2 * column)
            figures.addWidget(label, row, 2 * column + 1)
        figures.setColumnStretch(1, 1)
        figures.setColumnStretch(3, 1)
        left = QWidget(self)
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.setSpacing(4)
        left_layout.addLayout(top)
        left_layout.addWidget(self.chat_view, 1)
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
        self.side_tabs.addTab(self.sampling_controls, "")
        self.side_tabs.addTab(self.memory_view, "Memory")
        # in a dock shorter than the left side's minimum, it scrolls instead of holding the dock
        # tall. Its own scroll area, not one around the splitter: a scroll area counts the
        # height the wrapped figures need (height for width) only for a widget with a layout,
        # and without that a long verdict squeezed the chat under the prompt
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(left)
        splitter = QSplitter(Qt.Orientation.Horizontal, self)
        splitter.addWidget(scroll)
        splitter.addWidget(self.side_tabs)
        splitter.setStretchFactor(0, 1)
        splitter.setStretchFactor(1, 1)
        outer = QScrollArea(self)  # the side tabs' minimum, in a dock shorter still
        outer.setWidgetResizable(True)
        outer.setFrameShape(QFrame.Shape.NoFrame)
        outer.setWidget(splitter)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(outer)

    # -- state ---------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.request_id is not None

    def show_loaded_model(self, name: str | None, *, different: bool = False) -> None:
        """Say which model Run and Verify act on: ``name`` (the loaded source), ``None`` when
        none is; ``different`` when it is not the model on screen (kept loaded on purpose)."""
        if name is None:
            text, tip = "Runs on: no model loaded", "Load & dispatch a model to run it"
        else:
            short = str(name).rstrip("/").rsplit("/", 1)[-1]
            text = f"Runs on: <b>{escape(short)}</b> (loaded)"
            tip = f"Run and Verify use the model loaded in the worker: {name}"
            if different:
                text += " — <b>not the model on screen</b>; load it to run that one"
        self.loaded_label.setText(text)
        self.loaded_label.setToolTip(tip)
        self.loaded_label.setProperty("different", different)

    def clear_results(self) -> None:
        """Forget the shown output, figures, verify verdict and per-layer table (another model
        is on screen); the run history keeps its records."""
        self.output_edit.clear()
        self.chat_view.clear()
        for label in (self.ttft_label, self.rate_label, self.tokens_label):
            label.setText("—")
        self._clear_verify()
        self._stale = self.busy
        self.layer_table.setRowCount(0)
        self._layers_run = None
        self.layer_caption.setText("no finished run yet")

    def _on_model_loaded(self, summary: LoadSummary) -> None:
        """A model was loaded: Chat when it has a chat template, Raw prompt otherwise; a new
        chat, and no figures until a run on this load (the turns, the figures and the verdict
        shown were another load's: reloaded in nf4, the panel kept the bfloat16 run's TTFT and
        tok/s under the new load's name). A run in flight was for the load before."""
        self.loaded_summary = summary
        self.clear_results()
        self.ttft_title.setText(TTFT_TITLE if summary.is_causal_lm else FORWARD_TITLE)
        can_chat = summary.is_causal_lm and summary.has_tokenizer
        item = self.mode_combo.model().item(self.mode_combo.findData(CHAT))
        if item is not None:
            item.setEnabled(can_chat)
            item.setToolTip("" if can_chat else "this model takes no chat (no tokenizer or no LM)")
        self.chat_view.set_template(summary.chat_template)
        chat = can_chat and summary.chat_template
        if chat and self.prompt_edit.toPlainText() == RAW_DEFAULT_PROMPT:
            self.prompt_edit.setPlainText(CHAT_DEFAULT_MESSAGE)
        self.set_mode(CHAT if chat else RAW)
        if summary.memory is not None:  # no run yet: the load's measured memory is the news
            self.side_tabs.setCurrentWidget(self.memory_view)

    def _on_mode_combo_changed(self, *_: object) -> None:
        chat = self.mode == CHAT
        self.chat_view.setVisible(chat)
        self.output_edit.setVisible(not chat)
        self.new_chat_button.setVisible(chat)
        self.prompt_edit.setPlaceholderText(
            "Message (Ctrl+Enter runs)" if chat else "Prompt (empty: seeded random tokens)"
        )
        self.prompt_edit.setToolTip(
            "Your next message in the chat; Ctrl+Enter runs it"
            if chat
            else "The prompt; Ctrl+Enter runs it"
        )

    def _on_sampling_controls_changed(self) -> None:
        index = self.side_tabs.indexOf(self.sampling_controls)
        self.side_tabs.setTabText(index, f"Sampling: {self.sampling_controls.summary()}")
        self.side_tabs.setTabToolTip(
            index, describe_sampling(sampling_dict(self.sampling_controls.sampling()))
        )

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
    @property
    def mode(self) -> str:
        """``"chat"`` or ``"raw"`` (the mode selector)."""
        return str(self.mode_combo.currentData())

    def set_mode(self, mode: str) -> None:
        """Switch to ``"chat"`` or ``"raw"``."""
        self.mode_combo.setCurrentIndex(self.mode_combo.findData(mode))

    def run(self) -> int | None:
        """Send the chat message (Chat) or the prompt (Raw prompt) with max new tokens and the
        sampling settings; return the request id. The prediction is for this machine."""
        text = self.prompt_edit.toPlainText().strip()
        max_new = self.max_tokens_spin.value()
        sampling = self.sampling_controls.sampling()
        options = {"max_new_tokens": max_new, "sampling": sampling, "profile": None}
        if self.mode == CHAT:
            if not text:
                self._show_status("type a message, then Run")
                return None
            messages = self.chat_view.messages(text)
            return self._start(
                "infer", text, lambda: self.bridge.infer(None, messages=messages, **options)
            )
        prompt = text or None
        return self._start("infer", prompt, lambda: self.bridge.infer(prompt, **options))

    def verify(self) -> int | None:
        """Start the equivalence check on the prompt (in Chat: the message, else the last one
        sent), greedy continuation included; return the request id."""
        prompt = self.prompt_edit.toPlainText().strip() or None
        if prompt is None and self.mode == CHAT:
            prompt = next((t for r, t in reversed(self.chat_view.turns) if r == "user"), None)
        return self._start(
            "verify",
            prompt,
            lambda: self.bridge.verify(prompt, greedy_tokens=VERIFY_GREEDY_TOKENS),
        )

    def stop(self) -> None:
        """Cancel the run in flight (generation stops at the next token)."""
        if self.busy:
            self.bridge.cancel()
            self.status_label.setText("stopping…")

    def _start(self, kind: str, prompt: str | None, send: Callable[[], int]) -> int | None:
        device_map = self._loaded_map()
        if self.busy:
            return None
        if device_map is None:
            self._show_status(f"cannot {kind}: no model is loaded; load one first")
            return None
        try:
            request_id = send()
        except Exception as exc:  # not loaded any more, another job running
            reason = str(exc)
            # the worker's message may already say "cannot infer: …": say it once
            self._show_status(
                reason if reason.startswith("cannot ") else f"cannot {kind}: {reason}"
            )
            return None
        self.request_id = request_id
        self._stale = False
        self._sent_s = time.monotonic()
        self.current = RunRecord(
            run_id=self._next_run_id,
            kind=kind,
            started_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
            device_map=dict(device_map),
            prompt=prompt,
            max_new_tokens=self.max_tokens_spin.value() if kind == "infer" else 0,
            settings=self._settings(kind),
        )
        self._next_run_id += 1
        self.history.model.add(self.current)
        self._chat_turn = kind == "infer" and self.mode == CHAT
        if kind == "infer":
            self._streamed = []
            self._answer = ""
            self.output_edit.clear()
            self.output_edit.setPlaceholderText("Generated text streams here")
            if self._chat_turn:
                self.chat_view.begin(prompt or "")
                self.prompt_edit.clear()
            self.ttft_label.setText("…")
            self.rate_label.setText("…")
            self.tokens_label.setText("0")
            self._caption_layers(f"run {self.current.run_id} running…")
            self._clear_verify()  # the verdict shown was for another run
        else:
            self.verify_label.setText("verifying…")
            self.verify_label.setToolTip("")
        self._show_status(f"{kind} running…")
        self._failure_shown = False
        self.set_available(True)
        return request_id

    def _settings(self, kind: str) -> dict[str, Any]:
        """What a run's history row keeps about how it ran."""
        if kind != "infer":
            return {"greedy tokens compared": VERIFY_GREEDY_TOKENS}
        settings: dict[str, Any] = {"mode": MODE_LABELS[self.mode]}
        if self.mode == CHAT:
            summary = self.loaded_summary
            settings["prompt built with"] = (
                "the model's chat template"
                if summary is not None and summary.chat_template
                else "plain role lines (no chat template)"
            )
            settings["system prompt"] = self.chat_view.system_edit.text().strip() or "(none)"
            settings["turn"] = len(self.chat_view.turns) // 2 + 1
        settings["sampling"] = describe_sampling(sampling_dict(self.sampling_controls.sampling()))
        settings["max new tokens"] = self.max_tokens_spin.value()
        return settings

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
        self._answer += event.text
        self._streamed.append(event.elapsed_s)
        if self._stale:  # for a model no longer on screen: its record keeps the figures
            return
        if self._chat_turn:
            self.chat_view.stream(event.text)
        else:
            cursor = self.output_edit.textCursor()
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(event.text)
            self.output_edit.setTextCursor(cursor)
        self.tokens_label.setText(str(event.index + 1))
        if event.index == 0:
            self.ttft_label.setText(format_seconds(event.elapsed_s))

    def _on_bridge_phase(self, event: Phase) -> None:
        probing = _PROBING_TEXT.get(event.phase)
        if probing and event.request_id == self.request_id and not self._stale:
            self._show_status(*probing)

    def _on_bridge_result(self, event: Result) -> None:
        if isinstance(event.value, LoadSummary):
            self._on_model_loaded(event.value)
            return
        if event.request_id != self.request_id or self.current is None:
            return
        record, self.current, self.request_id = self.current, None, None
        record.status = "done"
        if isinstance(event.value, InferenceResult):
            self._show_inference(record, event.value)
        elif isinstance(event.value, VerifyResult):
            self._show_verify(record, event.value)
        self.history.model.update(record)
        if self._stale:  # for a model no longer on screen: history and log only
            self._show_status(
                f"{record.kind} run {record.run_id} done for another model; see history"
            )
            logger.info("%s (for a model no longer on screen: not shown)", outcome(record))
        else:
            self._show_status(f"{record.kind} done")
            logger.info("%s", outcome(record))
        self._stale = False
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
        if record.kind == "infer" and self._stale:  # for a model no longer on screen
            self._keep_partial(record, show=False)
            message += f" ({plural(record.new_tokens, 'token')} generated, another model)"
        elif record.kind == "infer":
            self._keep_partial(record)
            message += f" ({plural(record.new_tokens, 'token')} generated)"
            if self._chat_turn and record.status == "stopped":
                self.chat_view.finish(note="stopped")  # a stopped answer stays in the chat
            elif self._chat_turn:  # a failed turn leaves the chat; its message can be resent
                text = self.chat_view.discard()
                if text and not self.prompt_edit.toPlainText().strip():
                    self.prompt_edit.setPlainText(text)
            self._caption_layers(f"run {record.run_id} {record.status}, no timings")
        elif not self._stale:
            self.verify_label.setText(f"<b style='color:{FAIL_HEX}'>{record.status}</b>")
        self._stale = False
        self.history.model.update(record)
        self._show_status(message, event.details)
        self._failure_shown = True
        logger.info("%s", outcome(record, reason))
        self.set_available(self._loaded_map() is not None and event.kind != "worker_died")

    def _keep_partial(self, record: RunRecord, *, show: bool = True) -> None:
        """Put the figures of the tokens streamed before a stop into ``record`` and, when
        ``show``, into the labels."""
        streamed = self._streamed
        record.new_tokens = len(streamed)
        record.text = self._answer
        record.ttft_s = streamed[0] if streamed else None
        if len(streamed) > 1 and streamed[-1] > streamed[0]:
            record.tokens_per_s = (len(streamed) - 1) / (streamed[-1] - streamed[0])
        if not show:
            return
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
        record.one_forward = value.one_forward
        record.tokens_per_s = None if value.one_forward else value.tokens_per_s
        record.total_s = value.total_s
        record.predicted = dict(value.predicted)
        layers = group_layer_timings(value.per_layer, self.units, keep=self.keep_module)
        record.per_layer = [layer_dict(t) for t in layers]
        # generation can stop inside a multi-byte character: its bytes decode to a trailing
        # U+FFFD that is no character of the output, so neither the panel nor the record keep it
        record.text = value.text.rstrip("\ufffd")
        record.predicted_for = value.predicted_for
        record.settings["stopped by"] = STOP_REASONS.get(value.stop_reason, value.stop_reason)
        if self._stale:  # started for a model no longer on screen: history and log only
            return
        source = self.loaded_summary.source if self.loaded_summary is not None else ""
        empty = no_text_note(value.new_tokens, record.text, source)
        if self._chat_turn:
            self.chat_view.finish(record.text, empty)
        elif record.text != self.output_edit.toPlainText():  # the stream holds back bytes
            self.output_edit.setPlainText(record.text)
        if empty and not self._chat_turn:
            self.output_edit.setPlaceholderText(empty)
        self.ttft_title.setText(FORWARD_TITLE if value.one_forward else TTFT_TITLE)
        ttft, rate, tip = figures_with_predictions(value)
        for label, text in ((self.ttft_label, ttft), (self.rate_label, rate)):
            label.setText(text)
            label.setToolTip(tip)
        self.tokens_label.setText(
            empty or f"{value.new_tokens} new, {value.prompt_tokens} in prompt"
        )
        self.show_layers(layers)
        self._layers_run = record.run_id
        self._caption_layers()

    def _show_verify(self, record: RunRecord, value: VerifyResult) -> None:
        record.verify = verify_record(value)
        if self._stale:  # started for a model no longer on screen: history and log only
            return
        text, tip = verify_summary(value)
        self.verify_label.setText(text)
        self.verify_label.setToolTip(tip)

    def _clear_verify(self) -> None:
        """Show no verdict: the one shown belonged to another run or model."""
        self.verify_label.setText("not verified")
        self.verify_label.setToolTip("")

    def show_layers(self, per_layer: tuple[LayerTiming, ...] | list[LayerTiming]) -> None:
        """Fill the per-layer table with one forward's figures."""
        fill_layer_table(self.layer_table, per_layer)
