"""A chat with the loaded model: system prompt, the turns so far, the answer as it streams.

``ChatView`` keeps the conversation (``turns``: finished user/assistant pairs) and draws it as
a transcript. A run begins a turn with the user's message (``begin``), streams the answer
(``stream``), and ends it: ``finish`` keeps the turn in the history (a stopped answer too,
marked so), ``discard`` drops it (a failed run), so the next message continues the chat the
user sees. ``messages(text)`` is what the worker gets: the system prompt, the turns, the new
message.

Example:
    >>> view = ChatView()  # doctest: +SKIP
    >>> view.begin("What is the capital of France?")
    >>> view.stream(" Paris")
    >>> view.finish("Paris.")
"""

from __future__ import annotations

import html

from PySide6.QtGui import QPalette, QTextCursor
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QSizePolicy,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

ROLE_LABELS = {"user": "You", "assistant": "Model"}
TRANSCRIPT_MIN_LINES = 5


class ChatView(QWidget):
    """System prompt line, transcript, and the conversation those show.

    Attributes:
        system_edit: the system prompt (empty: none is sent).
        transcript: the read-only view of the turns.
        turns: finished ``(role, text)`` messages, user and assistant alternating.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.turns: list[tuple[str, str]] = []
        self._notes: dict[int, str] = {}  # turn index -> a note after it ("stopped")
        self._pending_user: str | None = None
        self._pending_answer = ""
        self.system_edit = QLineEdit(self)
        self.system_edit.setPlaceholderText("System prompt (optional)")
        self.system_edit.setToolTip(
            "Instructions sent before the conversation as the 'system' message; "
            "empty: none (the model's template may add its own)"
        )
        self.system_edit.setClearButtonEnabled(True)
        self.transcript = QTextBrowser(self)
        self.transcript.setOpenLinks(False)
        self.transcript.setPlaceholderText(
            "The conversation shows here: type a message below and Run (Ctrl+Enter)"
        )
        lines = self.fontMetrics().lineSpacing()
        # a question and the start of its answer stay readable when the figures below grow
        # (after a run and a verify); a shorter dock scrolls the panel instead
        self.transcript.setMinimumHeight(TRANSCRIPT_MIN_LINES * lines + 10)
        # it takes the room there is, but asks for no more than its minimum: the panel's scroll
        # area then scrolls only when even the minimum does not fit
        self.transcript.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
        self.template_label = QLabel(self)
        self.template_label.setWordWrap(False)
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(QLabel("system", self))
        top.addWidget(self.system_edit, 1)
        top.addWidget(self.template_label)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addLayout(top)
        layout.addWidget(self.transcript, 1)
        self.set_template(None)

    # -- the conversation ------------------------------------------------------------------
    @property
    def in_turn(self) -> bool:
        """True while an answer streams."""
        return self._pending_user is not None

    @property
    def answer(self) -> str:
        """The answer streamed so far in the turn in flight."""
        return self._pending_answer

    def messages(self, text: str) -> tuple[tuple[str, str], ...]:
        """The chat to send for the new user message ``text``."""
        system = self.system_edit.text().strip()
        head = (("system", system),) if system else ()
        return (*head, *self.turns, ("user", text))

    def begin(self, text: str) -> None:
        """Start a turn with the user's message ``text``."""
        self._pending_user, self._pending_answer = text, ""
        self._render()

    def stream(self, piece: str) -> None:
        """Add ``piece`` to the answer in flight."""
        if self._pending_user is None or not piece:
            return
        self._pending_answer += piece
        self._render()

    def finish(self, text: str | None = None, note: str = "") -> None:
        """End the turn and keep it; ``text`` replaces the streamed answer (the final decode),
        ``note`` is shown after it (e.g. "stopped")."""
        if self._pending_user is None:
            return
        answer = self._pending_answer if text is None else text
        self.turns += [("user", self._pending_user), ("assistant", answer)]
        self._notes[len(self.turns) - 1] = note
        self._pending_user, self._pending_answer = None, ""
        self._render()

    def discard(self) -> str | None:
        """Drop the turn in flight (its run failed); return its user message."""
        text, self._pending_user, self._pending_answer = self._pending_user, None, ""
        self._render()
        return text

    def clear(self) -> None:
        """Start a new chat (the system prompt stays)."""
        self.turns.clear()
        self._notes.clear()
        self._pending_user, self._pending_answer = None, ""
        self._render()

    def set_template(self, has_template: bool | None) -> None:
        """Say how the prompt is built: the model's template, or plain role lines."""
        if has_template is None:
            text, tip = "", ""
        elif has_template:
            text, tip = (
                "model's chat template",
                "The prompt is built with the model's chat template",
            )
        else:
            text = "no chat template: plain 'Role: text' lines"
            tip = (
                "This model's tokenizer has no chat template: the chat is sent as plain "
                "'System:/User:/Assistant:' lines for the model to continue"
            )
        self.template_label.setText(
            f"<span style='color:{self._muted}'>{html.escape(text, quote=False)}</span>"
        )
        self.template_label.setToolTip(tip)

    # -- drawing ---------------------------------------------------------------------------
    @property
    def _muted(self) -> str:
        """The colour of secondary text (notes, the template line): the theme's disabled text."""
        palette = self.palette()
        return palette.color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.WindowText).name()

    def _render(self) -> None:
        blocks = []
        for index, (role, text) in enumerate(self.turns):
            blocks.append(_block(role, text, self._notes.get(index, ""), self._muted))
        if self._pending_user is not None:
            blocks.append(_block("user", self._pending_user, "", self._muted))
            blocks.append(_block("assistant", self._pending_answer, "…", self._muted))
        self.transcript.setHtml("".join(blocks))
        self.transcript.moveCursor(QTextCursor.MoveOperation.End)
        bar = self.transcript.verticalScrollBar()
        bar.setValue(bar.maximum())

    def plain_text(self) -> str:
        """The transcript as plain text (what the user reads)."""
        return self.transcript.toPlainText()


def _block(role: str, text: str, note: str, muted: str) -> str:
    label = ROLE_LABELS.get(role, role)
    body = html.escape(text).replace("\n", "<br>") if text else ""
    tail = f" <span style='color:{muted}'>({html.escape(note)})</span>" if note else ""
    return f"<p><b>{label}</b><br>{body}{tail}</p>"
