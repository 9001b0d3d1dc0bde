"""What the host reports when the worker process ends, and how it stops a worker.

Pure helpers of ``WorkerHost``: ``exit_events`` turns an exit code and the jobs that were
running into the events the GUI shows; ``terminate`` stops a process for good.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import Any

from workbench.runtime.protocol import Event, Failed, WorkerExited


def exit_events(
    pid: int | None,
    exitcode: int | None,
    lost: list[tuple[int, str]],
    *,
    expected: bool,
    cancelled: bool,
    shutting_down: bool,
    cancel_grace_s: float,
    traces: Mapping[int, str] | None = None,
) -> list[Event]:
    """``Failed`` for each job that was running, then ``WorkerExited``.

    Args:
        pid: the worker's process id.
        exitcode: as ``multiprocessing`` reports it (negative: killed by that signal).
        lost: ``(request id, job kind)`` of the jobs still pending.
        expected: the host asked for the exit (shutdown, or a cancel that had to terminate).
        cancelled: the worker was terminated because it did not answer a cancel in time.
        shutting_down: the host is shutting down: pending jobs end silently.
        cancel_grace_s: how long a cancel was given, for the message.
        traces: request id -> where that job got to (last phase, tensor), for ``details``.
    """
    signal_number = -exitcode if exitcode is not None and exitcode < 0 else None
    if signal_number is not None:
        message = f"worker process {pid} was killed by signal {signal_number}"
    else:
        message = f"worker process {pid} exited with code {exitcode}"
    events: list[Event] = []
    how = exit_description(exitcode)
    for request_id, kind in lost:
        trace = (traces or {}).get(request_id, "")
        details = "\n".join(part for part in (f"worker process {pid}: {how}", trace) if part)
        if cancelled:
            why = (
                f"{kind} cancelled; the worker did not stop within {cancel_grace_s:.1f} s "
                "and was terminated"
            )
            events.append(Failed(request_id, why, details, kind="cancelled", job=kind))
        elif not shutting_down:
            why = f"{kind} failed: {message}"
            events.append(Failed(request_id, why, details, kind="worker_died", job=kind))
    events.append(
        WorkerExited(exitcode=exitcode, signal=signal_number, expected=expected, message=message)
    )
    return events


def exit_description(exitcode: int | None) -> str:
    """``"killed by signal 9 (SIGKILL)"``, ``"exit code 1"``, or ``"exit code unknown"``.

    Example:
        >>> exit_description(-11)
        'killed by signal 11 (SIGSEGV)'
    """
    if exitcode is None:
        return "exit code unknown"
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = "unknown signal"
    return f"killed by signal {-exitcode} ({name})"


def terminate(process: Any, grace_s: float = 1.0) -> None:
    """SIGTERM, then SIGKILL if it lingers; always joined (no zombies)."""
    process.terminate()
    process.join(grace_s)
    if process.is_alive():
        process.kill()
        process.join()
