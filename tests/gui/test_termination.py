"""SIGTERM and Ctrl+C reach the window through the Qt loop (``gui.termination``), real signals
raised in this process; the app-level behaviour (a real app process, its autosave) is in
``test_crash_recovery``."""

from __future__ import annotations

import select
import signal
from typing import Any

import pytest
from PySide6.QtWidgets import QWidget

from workbench.gui.termination import TerminationWatch

pytestmark = pytest.mark.gui


def test_sigterm_and_sigint_reach_the_gui_thread_and_other_signals_do_not(qtbot: Any) -> None:
    widget = QWidget()
    qtbot.addWidget(widget)
    others: list[int] = []
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    previous_usr1 = signal.signal(signal.SIGUSR1, lambda signum, frame: others.append(signum))
    calls: list[str] = []
    watch = TerminationWatch(widget, calls.append)
    try:
        assert watch.active
        signal.raise_signal(signal.SIGUSR1)  # its number reaches the socket too
        qtbot.waitUntil(lambda: others == [signal.SIGUSR1])
        reader = watch._sockets[0]  # the notifier has read its byte once nothing is left
        qtbot.waitUntil(lambda: not select.select([reader], [], [], 0)[0])
        assert calls == []
        signal.raise_signal(signal.SIGTERM)
        qtbot.waitUntil(lambda: calls == ["SIGTERM"])
        signal.raise_signal(signal.SIGINT)  # Ctrl+C: no KeyboardInterrupt, a close
        qtbot.waitUntil(lambda: calls == ["SIGTERM", "SIGINT"])
    finally:
        watch.remove()
        signal.signal(signal.SIGUSR1, previous_usr1)
    assert not watch.active
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert signal.set_wakeup_fd(-1) == -1
