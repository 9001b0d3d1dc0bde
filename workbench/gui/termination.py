"""Closing the window when the system asks: SIGTERM (a logout, a shutdown, ``kill``) and SIGINT
(Ctrl+C in the terminal that started the app).

Without a handler SIGTERM ends the process at once, and the next start says the last session
"did not end cleanly" even when nothing was unsaved (found driving the app: ``pkill`` after
opening a model). Qt's event loop runs no Python while it waits, so the signal is delivered
through a socket (``signal.set_wakeup_fd``) that a ``QSocketNotifier`` watches: the window
then closes as on File > Quit, without asking, keeping unsaved work in the autosave for the
next start to offer (``SessionDocuments.terminate``).

Example:
    >>> watch = TerminationWatch(window, window.documents.terminate)  # doctest: +SKIP
    >>> app.exec(); watch.remove()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QSocketNotifier

__all__ = ["TERMINATING_SIGNALS", "TerminationWatch"]

logger = logging.getLogger(__name__)

TERMINATING_SIGNALS = tuple(
    sig for sig in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGINT", None)) if sig
)


def _note_signal(signum: int, _frame: object) -> None:
    """The Python-level handler: the wake-up socket has the signal; the notifier acts on it."""


class TerminationWatch:
    """Calls ``on_terminate(name)`` on the GUI thread when SIGTERM or SIGINT arrives
    (``name``: ``"SIGTERM"`` or ``"SIGINT"``), until ``remove()`` puts the process's earlier
    handlers back.

    Args:
        parent: owns the notifier (the window).
        on_terminate: what the signal does (close the window without asking), given its name.

    Attributes:
        active: whether the signals are watched (not from a thread other than the main one,
            nor on a platform without ``set_wakeup_fd`` for sockets).
    """

    def __init__(self, parent: QObject, on_terminate: Callable[[str], None]) -> None:
        self._on_terminate = on_terminate
        self._previous: dict[int, Any] = {}
        self._previous_fd: int | None = None
        self._sockets: tuple[socket.socket, socket.socket] | None = None
        self._notifier: QSocketNotifier | None = None
        try:
            reader, writer = socket.socketpair()
            self._sockets = (reader, writer)
            reader.setblocking(False)
            writer.setblocking(False)
            self._previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
            for sig in TERMINATING_SIGNALS:
                self._previous[sig] = signal.signal(sig, _note_signal)
        except (OSError, ValueError) as exc:  # ValueError: not the main thread
            logger.debug("termination signals not watched: %s", exc)
            self.remove()
            return
        self._notifier = QSocketNotifier(reader.fileno(), QSocketNotifier.Type.Read, parent)
        self._notifier.activated.connect(self._activated)

    @property
    def active(self) -> bool:
        return self._notifier is not None

    def _activated(self) -> None:
        if self._sockets is None:
            return
        try:
            received = self._sockets[0].recv(64)
        except BlockingIOError:
            return
        # every signal with a Python handler writes its number here: act on ours only
        ours = [signal.Signals(code).name for code in received if code in TERMINATING_SIGNALS]
        if not ours:
            return
        logger.info("%s received: closing the window", ", ".join(dict.fromkeys(ours)))
        self._on_terminate(ours[0])

    def remove(self) -> None:
        """Restore the handlers and the wake-up descriptor as they were; close the sockets."""
        if self._notifier is not None:
            self._notifier.setEnabled(False)
            self._notifier = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()
        if self._previous_fd is not None:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(self._previous_fd)
            self._previous_fd = None
        if self._sockets is not None:
            for end in self._sockets:
                end.close()
            self._sockets = None
