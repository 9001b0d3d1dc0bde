"""``WorkerBridge``: the worker's events, which arrive on the host's reader thread, as Qt signals.

The reader thread only appends each event to a locked queue; it never calls into Qt. A
GUI-thread timer drains the queue every ``poll_ms`` (25 ms by default) and re-emits each event,
in order, on its typed signal. So a burst of thousands of events costs the GUI one wake-up, the
reader never blocks on the GUI, and slots always run on the GUI thread.

Why a timer and not a queued signal emitted from the reader thread: with PySide6 6.12 on
CPython 3.11, ``SignalInstance.emit()`` and ``processEvents()`` adjust the reference counts of
``None``/``True``/``False`` without holding the GIL (harmless from 3.12, where those objects
are immortal), which corrupts them ("Fatal Python error: bool_dealloc") when another Python
thread runs at the same time. Keeping every PySide call on the GUI thread avoids most of it;
``make_singletons_immortal()`` (run on import) makes the rest harmless on 3.10/3.11.

Progress is throttled to ``progress_hz`` (20 Hz by default): between two emitted ``Progress``
events only the newest is kept, and any other event first flushes the pending one, so the
order of events is preserved and the last progress before a ``Result`` is never lost.

Example:
    >>> bridge = WorkerBridge()  # doctest: +SKIP
    >>> bridge.progress.connect(lambda ev: print(ev.fraction))
    >>> bridge.load("/models/demo", {"": "cpu"})
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from workbench.gui.pyside_compat import make_singletons_immortal  # noqa: F401  (re-export)
from workbench.runtime.protocol import (
    Event,
    Failed,
    Log,
    Phase,
    Progress,
    Result,
    StateChanged,
    TelemetrySample,
    TokenStreamed,
    TransferBatch,
    WorkerExited,
    WorkerReady,
)
from workbench.runtime.worker import WorkerHost, WorkerStateError

logger = logging.getLogger(__name__)
worker_logger = logging.getLogger("workbench.worker")  # the worker's records, as the host sees them


HostFactory = Callable[..., Any]


class WorkerBridge(QObject):
    """Owns a ``WorkerHost`` and re-emits its events as Qt signals on the GUI thread.

    Args:
        parent: Qt parent.
        host_factory: builds the host from the event callback (default
            ``workbench.runtime.worker.WorkerHost``); extra keyword arguments go to it.
        progress_hz: the most ``progress`` signals per second.
        poll_ms: how often the GUI thread drains the event queue while the worker runs.
        worker_nice: niceness added to each worker process (POSIX), so that on a busy machine
            the GUI thread wins the CPU over a load: the window stays responsive and the
            worker loses almost nothing (the GUI needs little CPU). 0 leaves it alone.

    The worker's log records (``Log`` events: its ``workbench`` loggers and warnings) are logged
    again here on the ``workbench.worker`` logger at their level, so the Log tab shows them.

    Attributes:
        profile_provider: returns the hardware profile that inference predictions use.

    Signals (each carries the ``workbench.runtime.protocol`` event):
        progress, phase, log, telemetry, transfers, token, result, failed, exited, ready
        (``WorkerReady``: a new worker finished its imports): one per event type; ``state_changed(str)`` with the host's new state; ``event`` with every
        event after its typed signal.
    """

    progress = Signal(object)
    phase = Signal(object)
    log = Signal(object)
    telemetry = Signal(object)
    transfers = Signal(object)
    token = Signal(object)
    result = Signal(object)
    failed = Signal(object)
    exited = Signal(object)
    ready = Signal(object)
    state_changed = Signal(str)
    event = Signal(object)

    def __init__(
        self,
        parent: QObject | None = None,
        *,
        host_factory: HostFactory | None = None,
        progress_hz: float = 20.0,
        poll_ms: int = 25,
        worker_nice: int = 5,
        **host_options: Any,
    ) -> None:
        super().__init__(parent)
        self._queue: deque[Event] = deque()
        self._lock = threading.Lock()
        self._closed = False
        self._drain_timer = QTimer(self)
        self._drain_timer.setInterval(max(1, int(poll_ms)))
        self._drain_timer.timeout.connect(self._on_drain_timer_timeout)
        self._progress_period_s = 1.0 / progress_hz if progress_hz > 0 else 0.0
        self._pending_progress: Progress | None = None
        self._last_progress_s = float("-inf")
        self._progress_timer = QTimer(self)
        self._progress_timer.setSingleShot(True)
        self._progress_timer.timeout.connect(self._flush_progress)
        self._unload_thread: threading.Thread | None = None
        self.worker_nice = worker_nice
        self._niced_pid: int | None = None
        self.events_received = 0
        self.profile_provider: Callable[[], Any] | None = None
        if host_factory is None:
            host_factory = WorkerHost
        self.host = host_factory(self._on_host_event, **host_options)
        self._signals: dict[type, Signal] = {
            Progress: self.progress,
            Phase: self.phase,
            Log: self.log,
            TelemetrySample: self.telemetry,
            TransferBatch: self.transfers,
            TokenStreamed: self.token,
            Result: self.result,
            Failed: self.failed,
            WorkerExited: self.exited,
            WorkerReady: self.ready,
        }

    # -- requests (GUI thread) -----------------------------------------------------------
    @property
    def state(self) -> str:
        """The host's state: stopped, idle, loading, loaded, running."""
        return str(self.host.state)

    @property
    def warm(self) -> bool:
        """True when a worker runs and has finished its imports (a load pays only the load)."""
        return bool(getattr(self.host, "ready", True)) and self.state != "stopped"

    def start(self) -> None:
        """Spawn the worker process now (it is also spawned by the first ``load``)."""
        self._drain_timer.start()
        self.host.start()
        self._lower_worker_priority()

    def load(
        self,
        source: str | Path,
        device_map: Mapping[str, object],
        *,
        dtype: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> int:
        """Ask the worker to load ``source`` along ``device_map``; return the request id."""
        self._drain_timer.start()
        request_id = int(self.host.load(source, device_map, dtype=dtype, options=options))
        self._lower_worker_priority()
        return request_id

    def infer(self, prompt: str | None = None, **kwargs: Any) -> int:
        """Ask for an inference test (see ``WorkerHost.infer``); return the request id.

        Without a ``profile`` argument the prediction uses ``profile_provider()`` (the window's
        selected hardware profile, sent as its ``to_dict()`` data), so every panel predicts for
        the same hardware; with no provider the worker uses the detected hardware.
        """
        if "profile" not in kwargs and self.profile_provider is not None:
            profile = self.profile_provider()
            if profile is not None:
                kwargs["profile"] = profile.to_dict() if hasattr(profile, "to_dict") else profile
        return int(self.host.infer(prompt, **kwargs))

    def verify(self, prompt: str | None = None, **kwargs: Any) -> int:
        """Ask for the equivalence check (see ``WorkerHost.verify``); return the request id."""
        return int(self.host.verify(prompt, **kwargs))

    def cancel(self) -> bool:
        """Cancel the running job; False when nothing runs."""
        return bool(self.host.cancel())

    def unload(self) -> None:
        """Drop the model by restarting the worker, on a helper thread (it joins a process).

        Raises:
            WorkerStateError: while a job runs.
        """
        if self.state in ("loading", "running"):
            raise WorkerStateError("cannot unload while a job runs; cancel it first")
        if self._unload_thread is not None and self._unload_thread.is_alive():
            return
        self._unload_thread = threading.Thread(
            target=self._run_unload, name="worker-unload", daemon=True
        )
        self._unload_thread.start()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop the worker and stop delivering events; idempotent."""
        if self._unload_thread is not None:
            self._unload_thread.join(timeout_s)
        self.host.shutdown(timeout_s)
        self._on_drain_timer_timeout()  # deliver what the worker said last (e.g. WorkerExited)
        self._closed = True
        self._drain_timer.stop()
        self._progress_timer.stop()

    def _lower_worker_priority(self) -> None:
        pid = getattr(self.host, "pid", None)
        if not self.worker_nice or pid is None or pid == self._niced_pid:
            return
        self._niced_pid = pid
        try:
            import psutil  # noqa: PLC0415 (psutil: slow import, only to renice the worker)

            process = psutil.Process(pid)
            process.nice(max(process.nice(), psutil.Process().nice() + self.worker_nice))
        except Exception as exc:  # not POSIX, already gone, not permitted: only a nicety
            logger.debug("could not lower the worker's priority: %s", exc)

    def _run_unload(self) -> None:
        try:
            self.host.unload()
        except Exception as exc:  # shown like any other worker failure
            logger.exception("unload failed")
            self._on_host_event(Failed(None, f"unload failed: {exc}", kind="error", job="unload"))

    # -- events (reader thread -> GUI thread) --------------------------------------------
    def _on_host_event(self, event: Event) -> None:
        """Called on the host's reader (or unload) thread: queue only, never touch Qt."""
        with self._lock:
            if not self._closed:
                self._queue.append(event)

    def drain(self) -> int:
        """Deliver the queued events now (the timer does this every ``poll_ms``); return how many."""
        return self._on_drain_timer_timeout()

    def _on_drain_timer_timeout(self) -> int:
        with self._lock:
            if not self._queue:
                return 0
            events = list(self._queue)
            self._queue.clear()
        for event in events:
            self.events_received += 1
            self._dispatch(event)
        return len(events)

    def _dispatch(self, event: Event) -> None:
        if isinstance(event, Progress):
            self._pending_progress = event
            wait_s = self._last_progress_s + self._progress_period_s - time.monotonic()
            if wait_s <= 0:
                self._flush_progress()
            elif not self._progress_timer.isActive():
                self._progress_timer.start(max(1, int(wait_s * 1000)))
            return
        self._flush_progress()
        if isinstance(event, Log):
            worker_logger.log(event.level, "%s", event.message)
        elif isinstance(event, StateChanged):
            self._lower_worker_priority()  # a restarted worker (unload) is a new process
            self.state_changed.emit(event.state)
        signal = self._signals.get(type(event))
        if signal is not None:
            signal.emit(event)
        self.event.emit(event)

    def _flush_progress(self) -> None:
        event, self._pending_progress = self._pending_progress, None
        self._progress_timer.stop()
        if event is None:
            return
        self._last_progress_s = time.monotonic()
        self.progress.emit(event)
        self.event.emit(event)
