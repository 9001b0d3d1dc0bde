"""A one-line label that shows the start of a text too long for it.

A ``QLabel`` with an ``Ignored`` horizontal size policy cuts a long text at the side it is
aligned to: the Inference panel's right-aligned status showed "…t or ask for fewer new tokens
(0 tokens generated)" for a failure whose start said what failed. ``ElidedLabel`` paints the
start and an ellipsis instead; ``text()`` stays the whole text (the tooltip shows it).

Example:
    >>> label = ElidedLabel("a long failure message")  # doctest: +SKIP
    >>> label.shown_text()  # doctest: +SKIP
    'a long fail…'
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel

__all__ = ["ElidedLabel"]


class ElidedLabel(QLabel):
    """A plain-text one-line ``QLabel`` that elides at the right when its text is too long."""

    def shown_text(self) -> str:
        """What the label paints: its text, or its start and "…" when it does not fit."""
        return self.fontMetrics().elidedText(
            self.text(), Qt.TextElideMode.ElideRight, max(self.contentsRect().width(), 0)
        )

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(self.contentsRect(), int(self.alignment().value), self.shown_text())
        painter.end()
