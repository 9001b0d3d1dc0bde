"""The Log tab: ``workbench.*`` log records, delivered to the GUI thread through a signal."""

from __future__ import annotations

import contextlib
import logging

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QPlainTextEdit, QWidget

_FORMAT = logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")


class _Relay(QObject):
    line = Signal(str)


class _QtLogHandler(logging.Handler):
    def __init__(self, relay: _Relay) -> None:
        super().__init__(logging.INFO)
        self.relay = relay
        self.setFormatter(_FORMAT)

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(RuntimeError):  # the widget is gone (window closed)
            self.relay.line.emit(self.format(record))


class LogView(QPlainTextEdit):
    """Read-only log of the ``workbench`` loggers (at most 5000 lines)."""

    def __init__(self, parent: QWidget | None = None, logger_name: str = "workbench") -> None:
        super().__init__(parent)
        self.setObjectName("logView")
        self.setReadOnly(True)
        self.setMaximumBlockCount(5000)
        self._relay = _Relay(self)
        self._relay.line.connect(self.appendPlainText)
        self._handler = _QtLogHandler(self._relay)
        self._logger = logging.getLogger(logger_name)
        if self._logger.level == logging.NOTSET:
            self._logger.setLevel(logging.INFO)  # the tab shows progress lines, not only warnings
        self._logger.addHandler(self._handler)

    def detach(self) -> None:
        """Stop receiving records (called when the window closes)."""
        self._logger.removeHandler(self._handler)
