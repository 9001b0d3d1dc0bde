"""Run slow work (opening a model, planning a 98k-module tree) off the GUI thread.

``TaskThread`` runs one function in a ``QThread`` and delivers its result or its exception
through queued signals, so slots run on the GUI thread. Every started thread is tracked until
it finishes, which lets tests assert that none outlives them (``running_threads``).

A finished thread lets go of its function and arguments (a speed prediction's tree and map
copy, a planner request's model) and of itself: it has no Qt parent, so once its owner drops
or replaces its reference the object is freed; nothing piles up under the window after many
edits.

Example:
    >>> thread = TaskThread(open_model, "/models/demo")  # doctest: +SKIP
    >>> thread.succeeded.connect(window._on_open_succeeded)
    >>> thread.start()
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QEventLoop, QObject, QThread, QTimer, Signal

logger = logging.getLogger(__name__)

_RUNNING: set[TaskThread] = set()
_FINISHED: list[TaskThread] = []  # kept one event-loop turn, so none is freed in its own slot


class TaskThread(QThread):
    """One function call on a worker thread.

    Signals:
        succeeded(object): the return value.
        failed(object): the exception raised (shown by the GUI; the app keeps running).

    Args:
        function: what to call; it must not touch widgets.
        args: positional arguments.
        parent: Qt parent; leave it ``None`` (the default) so the object is freed once its
            owner lets go of it; a running thread is kept alive by the module.
        kwargs: keyword arguments.
    """

    succeeded = Signal(object)
    failed = Signal(object)

    def __init__(
        self,
        function: Callable[..., Any],
        *args: Any,
        parent: QObject | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(parent)
        self._function = function
        self._args = args
        self._kwargs = kwargs
        self.elapsed_s = 0.0
        self.finished.connect(self._on_thread_finished)

    def start(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        _RUNNING.add(self)
        super().start(*args, **kwargs)

    def run(self) -> None:
        start_s = time.perf_counter()
        try:
            result = self._function(*self._args, **self._kwargs)
        except Exception as exc:
            logger.debug("task %s failed", getattr(self._function, "__name__", "?"), exc_info=True)
            self.elapsed_s = time.perf_counter() - start_s
            self.failed.emit(exc)
            return
        self.elapsed_s = time.perf_counter() - start_s
        self.succeeded.emit(result)

    def _on_thread_finished(self) -> None:
        self.wait()  # ``finished`` fires just before the thread exits; let it end first
        self._function, self._args, self._kwargs = _done, (), {}
        if self in _RUNNING:
            _RUNNING.discard(self)
            _FINISHED.append(self)
            QTimer.singleShot(0, _FINISHED.clear)


def _done() -> None:
    """Stands in for a finished thread's function (it keeps no reference to its work)."""


def running_threads() -> list[TaskThread]:
    """Return the task threads started and not yet finished."""
    return [thread for thread in _RUNNING if thread.isRunning()]


def wait_for_threads(timeout_ms: int = 10_000) -> bool:
    """Wait for every running task thread; return True when all finished in time."""
    deadline = time.monotonic() + timeout_ms / 1000
    for thread in list(_RUNNING):
        remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
        if not thread.wait(remaining_ms):
            return False
    return True


def run_event_loop_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Run the Qt event loop until ``predicate()`` holds or ``timeout_s`` passes (checked every
    20 ms); return ``predicate()``. For scripts and benchmarks, which have no qtbot."""
    loop = QEventLoop()
    deadline = time.monotonic() + timeout_s
    check = QTimer()
    check.setInterval(20)
    check.timeout.connect(lambda: (predicate() or time.monotonic() > deadline) and loop.quit())
    check.start()
    if not predicate():
        loop.exec()
    check.stop()
    return predicate()
