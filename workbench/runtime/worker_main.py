"""The worker process's loop: one job at a time, a listener thread for cancel, a sampler thread.

Runs in a process spawned by ``WorkerHost``. The main thread runs jobs; a listener thread reads
requests so that ``Cancel`` reaches a job in the middle of a load; a ``MemorySampler`` thread
sends telemetry. If the host goes away (its pipe closes), the worker cancels and exits, so it
never outlives its host.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection

from workbench.big_modeling.progress import CancelToken
from workbench.runtime.c_heap import apply_heap_policy
from workbench.runtime.import_noise import quiet_import_noise
from workbench.runtime.jobs import JobRunner, import_load_observer
from workbench.runtime.protocol import (
    Cancel,
    Event,
    Failed,
    Infer,
    Load,
    Log,
    Request,
    Shutdown,
    Verify,
    WorkerReady,
)
from workbench.runtime.telemetry import MemorySampler

logger = logging.getLogger(__name__)


class _Sender:
    """Thread-safe ``send`` over the event pipe; silently drops events once the pipe is closed."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self.closed = False

    def __call__(self, event: Event) -> None:
        with self._lock:
            if self.closed:
                return
            try:
                self._conn.send(event)
            except (OSError, EOFError, ValueError):
                self.closed = True


FORWARDED_LOGGERS = ("workbench", "py.warnings")  # py.warnings: the engine's warnings.warn


class _LogForwarder(logging.Handler):
    """Sends ``workbench`` log records and Python warnings to the host as ``Log`` events."""

    def __init__(self, send: _Sender, level: int) -> None:
        super().__init__(level)
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._send(Log(level=record.levelno, message=self.format(record)))
        except Exception:
            self.handleError(record)


class _Listener:
    """Reads requests on a thread; ``Cancel`` sets the current token and drops queued jobs."""

    def __init__(self, requests: Connection, send: _Sender) -> None:
        self._requests = requests
        self._send = send
        self.jobs: queue.Queue[Request] = queue.Queue()
        self._lock = threading.Lock()
        self._token: CancelToken | None = None
        self._thread = threading.Thread(target=self._run, name="request-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def begin(self, token: CancelToken) -> None:
        with self._lock:
            self._token = token

    def end(self) -> None:
        with self._lock:
            self._token = None

    def _run(self) -> None:
        while True:
            try:
                request = self._requests.recv()
            except (EOFError, OSError):  # the host is gone: stop everything
                self._cancel_current()
                self.jobs.put(Shutdown(request_id=-1))
                return
            if isinstance(request, Cancel):
                self._cancel_current()
                self._drop_queued()
            elif isinstance(request, Shutdown):
                self.jobs.put(request)
                return
            else:
                self.jobs.put(request)

    def _cancel_current(self) -> None:
        with self._lock:
            if self._token is not None:
                self._token.cancel()

    def _drop_queued(self) -> None:
        while True:
            try:
                request = self.jobs.get_nowait()
            except queue.Empty:
                return
            if isinstance(request, (Load, Infer, Verify)):
                self._send(
                    Failed(
                        request.request_id,
                        f"{request.kind} cancelled before it started",
                        details="a cancel arrived while the job waited in the queue",
                        kind="cancelled",
                        job=request.kind,
                    )
                )
            else:
                self.jobs.put(request)
                return


def _preload() -> None:
    """Import what a load needs (torch, transformers, the engine) before the first request."""
    try:
        import transformers  # noqa: F401, PLC0415 (preloading is the point: off the first request's path)

        import workbench.big_modeling.loading.api  # noqa: PLC0415 (preloaded with transformers)
        import workbench.models.intake  # noqa: F401, PLC0415 (preloaded with transformers)
    except Exception:  # the load itself will report the problem properly
        logger.debug("preload failed", exc_info=True)


def worker_main(
    requests: Connection,
    events: Connection,
    sample_hz: float,
    log_level: int = logging.WARNING,
    preload: bool = False,
    load_observer: str | None = None,
) -> None:
    """Entry point of the worker process (the target ``WorkerHost`` spawns).

    Sends ``WorkerReady`` once the imports a load needs are done (at once without ``preload``).
    ``load_observer`` (``"module:function"``) is imported before that and given to the
    ``JobRunner`` (see ``workbench.runtime.jobs``); a name that does not import ends the worker
    with the error.
    """
    start_s = time.perf_counter()
    apply_heap_policy()  # a fixed mmap threshold if the user asked for one (c_heap)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the host, which shuts us down
    send = _Sender(events)
    forwarder = _LogForwarder(send, max(logging.INFO, log_level or logging.WARNING))
    forwarder.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logging.captureWarnings(True)  # warnings.warn -> the "py.warnings" logger -> the host
    forwarded = [logging.getLogger(name) for name in FORWARDED_LOGGERS]
    for source in forwarded:
        source.addHandler(forwarder)
        source.setLevel(forwarder.level)
    quiet_import_noise()
    sampler = MemorySampler(send, rate_hz=sample_hz)
    sampler.start()
    listener = _Listener(requests, send)
    listener.start()
    observer = None if load_observer is None else import_load_observer(load_observer)
    runner = JobRunner(send, load_observer=observer)
    if preload:
        _preload()
    send(WorkerReady(pid=os.getpid(), warmup_s=time.perf_counter() - start_s))
    try:
        while True:
            request = listener.jobs.get()
            if isinstance(request, Shutdown):
                break
            token = CancelToken()
            listener.begin(token)
            try:
                runner.run(request, token)
            except BaseException as exc:  # the runner reports job errors itself; this is a bug
                send(
                    Failed(
                        request.request_id,
                        f"worker error: {type(exc).__name__}: {exc}",
                        details=traceback.format_exc(),
                        job=request.kind,
                    )
                )
            finally:
                listener.end()
    finally:
        _close_quietly(sampler.stop)  # no runner.close(): process exit frees memory faster
        for source in forwarded:
            _close_quietly(lambda source=source: source.removeHandler(forwarder))
        send.closed = True
        _close_quietly(events.close)
        _close_quietly(sys.stdout.flush)
        _close_quietly(sys.stderr.flush)
        # Skip interpreter finalisation: with torch and tokenizers loaded it can block in
        # native thread-pool teardown for seconds. Everything the worker owns is released.
        os._exit(0)


def _close_quietly(step: Callable[[], object]) -> None:
    """Run one exit step; a failure there must not turn a clean shutdown into exit code 1."""
    try:
        step()
    except Exception:
        logger.debug("worker exit step failed", exc_info=True)
