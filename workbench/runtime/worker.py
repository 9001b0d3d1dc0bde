"""``WorkerHost``: the host side of the worker process that holds the dispatched model.

The host spawns the worker (``multiprocessing`` "spawn" context), sends it requests over a pipe
and reads its events on a reader thread, which also watches the process sentinel: a worker
killed by SIGKILL, a segfault or the OOM killer is reported as ``WorkerExited`` (with the
signal) plus ``Failed(kind="worker_died")`` for the job it was running. The callback runs on
the reader thread; a GUI bridge re-emits the events as Qt signals.

A load that does not finish (cancelled or failed) leaves its memory in the process: freed
tensors stay in the allocator's arenas and a cancelled build may still be running. So the host
retires that worker (it exits, and the system gets every byte back) and starts a fresh one at
once, which imports in the background; ``WorkerExited`` is not reported for a retired worker.

The host owns one temporary offload folder per load (named after the host's pid) and deletes
it on cancel, unload, failure, worker death and shutdown, so a crash leaves no files behind;
when a host itself dies, the next host's ``start()`` sweeps the folders of dead hosts.

Example:
    >>> host = WorkerHost(print)  # doctest: +SKIP
    >>> host.load("/models/demo", {"": "cpu"})
    >>> host.infer("Hello", max_new_tokens=8)
    >>> host.shutdown()
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from workbench.big_modeling.device_map.value import normalize_device_map
from workbench.runtime.jobs import JobTrace
from workbench.runtime.offload_folders import new_offload_folder, sweep_stale_offload_folders
from workbench.runtime.protocol import (
    Cancel,
    Event,
    Failed,
    Infer,
    Load,
    Phase,
    Progress,
    Request,
    Result,
    Sampling,
    Shutdown,
    StateChanged,
    TelemetrySample,
    TransferBatch,
    Verify,
    WorkerReady,
)
from workbench.runtime.telemetry import DEFAULT_SAMPLE_HZ, MemoryHistory, TransferHistory
from workbench.runtime.worker_exit import exit_events, terminate
from workbench.runtime.worker_main import worker_main

logger = logging.getLogger(__name__)

STATES = ("stopped", "idle", "loading", "loaded", "running")
READER_POLL_S = 0.25


class WorkerStateError(RuntimeError):
    """A request the host's current state does not allow (e.g. ``infer`` with no model)."""


class WorkerHost:
    """Starts the worker, sends it requests, delivers its events to ``on_event``.

    Args:
        on_event: called on the host's reader thread with every ``Event``.
        sample_hz: the worker's memory sampling rate.
        cancel_grace_s: after ``cancel()``, how long the job has to answer before the worker
            process is terminated.
        offload_root: where per-load offload folders are created (default:
            ``workbench.models.hardware.default_offload_root()``).
        history_capacity: samples kept in ``memory`` and events kept in ``transfers``.
        preload_imports: the worker imports torch/transformers/the engine as soon as it starts,
            so ``start()`` early (e.g. when the window opens) makes the first load faster.
        load_observer: ``"module:function"`` of a load observer the worker imports and gives
            its ``JobRunner`` (a developer extension point, see ``workbench.runtime.jobs``);
            the worker starts with this process's ``sys.path``. Default none.

    Attributes:
        memory: ``MemoryHistory`` fed by the worker's telemetry samples.
        transfers: ``TransferHistory`` fed by the worker's transfer batches.
    """

    def __init__(
        self,
        on_event: Callable[[Event], None],
        *,
        sample_hz: float = DEFAULT_SAMPLE_HZ,
        cancel_grace_s: float = 2.0,
        offload_root: str | Path | None = None,
        history_capacity: int = 3000,
        preload_imports: bool = True,
        load_observer: str | None = None,
    ) -> None:
        self._on_event = on_event
        self.sample_hz = sample_hz
        self.preload_imports = preload_imports
        self.load_observer = load_observer
        self.cancel_grace_s = cancel_grace_s
        self.offload_root = None if offload_root is None else Path(offload_root)
        self.memory = MemoryHistory(history_capacity)
        self.transfers = TransferHistory(max(1000, history_capacity * 10))
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.RLock()
        self._send_lock = threading.Lock()
        # Two threads may wait for the process (shutdown and the reader); an unserialised
        # second waitpid gets ECHILD and multiprocessing then reports exitcode None.
        self._reap_lock = threading.Lock()
        self._process: Any = None
        self._requests: Connection | None = None
        self._reader: threading.Thread | None = None
        self._pending: OrderedDict[int, str] = OrderedDict()  # request_id -> kind, in order
        self._traces: dict[int, JobTrace] = {}  # request_id -> where it got to
        self._idle = threading.Condition(self._lock)  # notified when _pending empties
        self._model_loaded = False
        self._state = "stopped"
        self._next_id = 0
        self._cancel_deadline: float | None = None
        self._terminated_for_cancel = False
        self._expect_exit = False
        # workers replaced after a load that did not finish: process -> terminate-after time
        self._retired: dict[Any, float] = {}
        self.retired_pids: list[int] = []  # every retired worker's pid, oldest first
        self._ready = threading.Event()  # the current worker sent WorkerReady
        self._started_s: float | None = None
        self.warmup_s: float | None = None  # start() to WorkerReady of the current worker
        self.offload_folder: Path | None = None
        self.last_load: Load | None = None

    # -- public API --------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """One of ``STATES``: stopped, idle, loading, loaded, running."""
        return self._state

    @property
    def pid(self) -> int | None:
        process = self._process
        return None if process is None else process.pid

    def is_alive(self) -> bool:
        process = self._process
        return process is not None and process.is_alive()

    @property
    def ready(self) -> bool:
        """True once the running worker has done its imports (``WorkerReady``): warm."""
        return self._process is not None and self._ready.is_set()

    def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """Block until the running worker is warm (tests, benchmarks). False on timeout."""
        return self._ready.wait(timeout_s) and self._process is not None

    def wait_retired(self, timeout_s: float = 30.0) -> None:
        """Block until every retired worker has exited and been reaped (tests)."""
        self._reap_retired(timeout_s)

    def start(self) -> None:
        """Spawn the worker (no-op when it runs). Returns at once; the worker imports lazily."""
        with self._lock:
            if self._process is not None:
                return
            sweep_stale_offload_folders(self.offload_root)
            req_recv, req_send = self._ctx.Pipe(duplex=False)
            ev_recv, ev_send = self._ctx.Pipe(duplex=False)
            process = self._ctx.Process(
                target=worker_main,
                args=(
                    req_recv,
                    ev_send,
                    self.sample_hz,
                    logging.getLogger().level,
                    self.preload_imports,
                    self.load_observer,
                ),
                name="workbench-worker",
                daemon=True,
            )
            self._ready.clear()
            self.warmup_s = None
            self._started_s = time.monotonic()
            process.start()
            req_recv.close()  # the child's ends live in the child now
            ev_send.close()
            self._process, self._requests = process, req_send
            self._expect_exit = False
            self._terminated_for_cancel = False
            self._reader = threading.Thread(
                target=self._read_loop, args=(process, ev_recv), name="worker-reader", daemon=True
            )
            self._reader.start()
            self._update_state()

    def load(
        self,
        source: str | Path,
        device_map: Mapping[str, object],
        *,
        dtype: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> int:
        """Load ``source`` along ``device_map`` (replacing a loaded model); return the request id.

        Raises:
            WorkerStateError: while another job runs (cancel it first).
            DeviceMapError: for an unknown device in ``device_map``.
            OffloadError: when the offload folder cannot be created (the message says where and
                how to choose another root); no worker is started for it.
        """
        clean_map = normalize_device_map(device_map)  # type: ignore[arg-type]
        with self._lock:
            self._require_no_job("load")
            self._remove_offload_folder()
            self.offload_folder = new_offload_folder(self.offload_root)  # before a worker starts
            self.start()
            self.transfers.reset()  # module names are per model: the table stays bounded
            request = Load(
                request_id=self._new_id(),
                source=str(source),
                device_map=clean_map,
                dtype=dtype,
                offload_folder=str(self.offload_folder),
                options=dict(options or {}),
            )
            self.last_load = request
            self._model_loaded = False
            return self._submit(request)

    def infer(
        self,
        prompt: str | None = None,
        *,
        max_new_tokens: int = 16,
        synthetic_tokens: int = 8,
        profile: str | Mapping[str, Any] | None = None,
        messages: Sequence[tuple[str, str]] = (),
        sampling: Sampling | None = None,
    ) -> int:
        """Run an inference test on the loaded model; return the request id.

        ``profile`` is the hardware the speed prediction is for: a profile name, a profile's
        ``to_dict()`` data (a what-if profile the worker cannot look up by name), or ``None``
        for the detected hardware. ``messages`` (a chat) and ``sampling``: see ``Infer``.

        Raises:
            WorkerStateError: when no model is loaded or a job runs.
        """
        with self._lock:
            self._require_loaded("infer")
            request = Infer(
                request_id=self._new_id(),
                prompt=prompt,
                max_new_tokens=int(max_new_tokens),
                synthetic_tokens=int(synthetic_tokens),
                profile=dict(profile) if isinstance(profile, Mapping) else profile,  # type: ignore[arg-type]
                messages=tuple((str(role), str(text)) for role, text in messages),
                sampling=sampling or Sampling(),
            )
            return self._submit(request)

    def verify(
        self,
        prompt: str | None = None,
        *,
        synthetic_tokens: int = 8,
        atol: float = 0.0,
        rtol: float = 0.0,
        mode: str = "auto",
        greedy_tokens: int = 0,
    ) -> int:
        """Compare the dispatched model with an undispatched CPU copy; return the request id.

        ``mode``: ``"full"``, ``"layers"`` (unit by unit) or ``"auto"`` (full when it fits);
        ``greedy_tokens``: also compare that many greedy tokens (see ``Verify``).
        """
        with self._lock:
            self._require_loaded("verify")
            request = Verify(
                request_id=self._new_id(),
                prompt=prompt,
                synthetic_tokens=int(synthetic_tokens),
                atol=atol,
                rtol=rtol,
                mode=mode,
                greedy_tokens=int(greedy_tokens),
            )
            return self._submit(request)

    def cancel(self) -> bool:
        """Cancel the running job (and drop queued ones). Return False when nothing runs.

        The job stops at its next check (between tensors or tokens); if the worker has not
        answered after ``cancel_grace_s`` it is terminated and ``WorkerExited`` follows.
        """
        with self._lock:
            if not self._pending or self._process is None:
                return False
            self._send(Cancel(request_id=self._new_id()))
            if self._cancel_deadline is None:
                self._cancel_deadline = time.monotonic() + self.cancel_grace_s
            return True

    def unload(self) -> None:
        """Drop the model and give every byte back by restarting the worker process."""
        with self._lock:
            self._require_no_job("unload")
            was_running = self._process is not None
        self.shutdown()
        if was_running:
            self.start()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop the worker (terminating it if it does not exit in ``timeout_s``); idempotent."""
        with self._lock:
            process, reader = self._process, self._reader
            if process is None:
                self._remove_offload_folder()
                self._reap_retired(timeout_s)
                return
            self._expect_exit = True
            self._cancel_all_quietly()
            with contextlib.suppress(OSError):  # the worker may already be gone
                self._send(Shutdown(request_id=self._new_id()))
        with self._reap_lock:
            process.join(timeout_s)
            if process.is_alive():
                logger.warning(
                    "worker %s did not exit in %.1f s; terminating", process.pid, timeout_s
                )
                terminate(process)
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout_s)
        self._reap_retired(timeout_s)

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Block until no job is pending (tests, CLI). Return False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout_s)

    def __enter__(self) -> WorkerHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- internals ---------------------------------------------------------------------------

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _require_no_job(self, what: str) -> None:
        if self._pending:
            running = next(iter(self._pending.values()))
            raise WorkerStateError(f"cannot {what} while a {running} job runs; cancel it first")

    def _require_loaded(self, what: str) -> None:
        self._require_no_job(what)
        if not self._model_loaded or self._process is None:
            raise WorkerStateError(f"cannot {what}: no model is loaded; load one first")

    def _submit(self, request: Request) -> int:
        self._pending[request.request_id] = request.kind
        self._traces[request.request_id] = JobTrace()
        self._send(request)
        self._update_state()
        return request.request_id

    def _send(self, request: Request) -> None:
        if self._requests is None:
            raise WorkerStateError("the worker is not running; call start() first")
        with self._send_lock:
            self._requests.send(request)

    def _cancel_all_quietly(self) -> None:
        if self._pending:
            with contextlib.suppress(OSError):
                self._send(Cancel(request_id=self._new_id()))

    def _update_state(self) -> None:
        with self._lock:
            if self._process is None:
                new = "stopped"
            elif self._pending:
                new = "loading" if next(iter(self._pending.values())) == "load" else "running"
            else:
                new = "loaded" if self._model_loaded else "idle"
            previous, self._state = self._state, new
        if new != previous:
            self._deliver(StateChanged(state=new, previous=previous))

    def _deliver(self, event: Event) -> None:
        try:
            self._on_event(event)
        except Exception:  # a broken view must not kill the reader thread
            logger.exception("worker event callback failed on %s", event.type_name)

    def _remove_offload_folder(self) -> None:
        folder, self.offload_folder = self.offload_folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def _read_loop(self, process: Any, events: Connection) -> None:
        try:
            while True:
                retire_by = self._retired.get(process)
                if retire_by is not None and time.monotonic() >= retire_by:
                    logger.warning("retired worker %s did not exit; terminating it", process.pid)
                    with self._reap_lock:
                        terminate(process)
                deadline = None if retire_by is not None else self._cancel_deadline
                if deadline is not None and time.monotonic() >= deadline:
                    logger.warning("worker did not answer cancel in time; terminating it")
                    self._terminated_for_cancel = True
                    self._cancel_deadline = None
                    with self._reap_lock:
                        terminate(process)
                # wake at least every READER_POLL_S so a cancel deadline set meanwhile counts
                timeout = READER_POLL_S
                if deadline is not None:
                    timeout = max(0.0, min(READER_POLL_S, deadline - time.monotonic()))
                ready = wait([events, process.sentinel], timeout)
                if events in ready:
                    try:
                        event = events.recv()
                    except (EOFError, OSError):
                        ready = [process.sentinel]
                    else:
                        self._handle(event, process)
                        continue
                if process.sentinel in ready:
                    self._handle_exit(process, events)
                    return
        finally:
            events.close()

    def _handle(self, event: Event, process: Any = None) -> None:
        if process is not None and process is not self._process:
            return  # a retired worker's last words (telemetry, logs) are not news
        if isinstance(event, (Phase, Progress)):
            trace = self._traces.get(event.request_id)
            if trace is not None:
                trace.see(event)
        if isinstance(event, WorkerReady):
            if self._started_s is not None:
                self.warmup_s = time.monotonic() - self._started_s
            self._ready.set()
        elif isinstance(event, TelemetrySample):
            self.memory.add(event)
        elif isinstance(event, TransferBatch):
            self.transfers.add(event)
        elif isinstance(event, (Result, Failed)) and event.request_id in self._pending:
            with self._lock:
                kind = self._pending.pop(event.request_id)
                self._traces.pop(event.request_id, None)
                unfinished_load = kind == "load" and not isinstance(event, Result)
                if kind == "load":
                    self._model_loaded = not unfinished_load
                    if unfinished_load:
                        self._remove_offload_folder()
                if unfinished_load and process is not None and process is self._process:
                    self._replace_worker(process)  # before the news: the host is idle again
                if not self._pending:
                    self._cancel_deadline = None
                    self._idle.notify_all()
            self._deliver(event)
            self._update_state()
            return
        self._deliver(event)

    def _replace_worker(self, process: Any) -> None:
        """Retire ``process`` (it exits; its reader reaps it) and start a fresh worker.

        Called with the lock held, on ``process``'s reader thread.
        """
        self._retired[process] = time.monotonic() + max(self.cancel_grace_s, 5.0)
        self.retired_pids.append(process.pid)
        requests = self._requests
        self._process = self._requests = self._reader = None
        if requests is not None:
            with contextlib.suppress(OSError), self._send_lock:
                requests.send(Shutdown(request_id=self._new_id()))
            requests.close()  # a worker that missed the Shutdown sees its pipe close and exits
        logger.info("worker %s retired after an unfinished load; starting a fresh one", process.pid)
        self.start()

    def _reap_retired(self, timeout_s: float) -> None:
        """Wait for retired workers to exit (terminating those that linger)."""
        for process in list(self._retired):
            with self._reap_lock:
                process.join(timeout_s)
                if process.is_alive():
                    terminate(process)
            self._retired.pop(process, None)

    def _handle_exit(self, process: Any, events: Connection) -> None:
        while True:  # events written just before death still count
            try:
                if not events.poll():
                    break
                self._handle(events.recv(), process)
            except (EOFError, OSError):
                break
        with self._reap_lock:
            process.join()
            exitcode = process.exitcode
        if process is not self._process:  # retired: replaced by a fresh worker already
            with self._lock:
                self._retired.pop(process, None)
            logger.debug("retired worker %s exited with %s", process.pid, exitcode)
            return
        with self._lock:
            expected = self._expect_exit or self._terminated_for_cancel
            cancelled = self._terminated_for_cancel
            shutting_down = self._expect_exit
            lost = list(self._pending.items())
            traces = {rid: trace.describe() for rid, trace in self._traces.items()}
            self._pending.clear()
            self._traces.clear()
            self._idle.notify_all()
            self._cancel_deadline = None
            self._model_loaded = False
            self._process = None
            self._requests = None
            self._ready.clear()
            self._remove_offload_folder()
        for event in exit_events(
            process.pid,
            exitcode,
            lost,
            expected=expected,
            cancelled=cancelled,
            shutting_down=shutting_down,
            cancel_grace_s=self.cancel_grace_s,
            traces=traces,
        ):
            self._deliver(event)
        self._update_state()
