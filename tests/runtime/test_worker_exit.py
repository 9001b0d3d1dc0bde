"""The events the host reports when the worker process ends."""

from __future__ import annotations

import multiprocessing
import time

from workbench.runtime.protocol import Failed, WorkerExited
from workbench.runtime.worker_exit import exit_events, terminate


def test_a_killed_worker_fails_the_running_job_then_reports_the_signal() -> None:
    events = exit_events(
        41,
        -9,
        [(7, "load")],
        expected=False,
        cancelled=False,
        shutting_down=False,
        cancel_grace_s=2.0,
    )
    failed, exited = events
    assert isinstance(failed, Failed) and failed.kind == "worker_died" and failed.job == "load"
    assert failed.message == "load failed: worker process 41 was killed by signal 9"
    assert isinstance(exited, WorkerExited) and exited.signal == 9 and not exited.expected


def test_a_cancel_that_had_to_terminate_says_so() -> None:
    failed, exited = exit_events(
        41,
        -15,
        [(3, "infer")],
        expected=True,
        cancelled=True,
        shutting_down=False,
        cancel_grace_s=2.0,
    )
    assert failed.kind == "cancelled"
    assert "did not stop within 2.0 s" in failed.message
    assert exited.expected


def test_shutdown_ends_pending_jobs_silently() -> None:
    (exited,) = exit_events(
        41,
        0,
        [(3, "infer")],
        expected=True,
        cancelled=False,
        shutting_down=True,
        cancel_grace_s=2.0,
    )
    assert exited == WorkerExited(0, None, True, "worker process 41 exited with code 0")


def test_terminate_stops_and_reaps_a_real_process() -> None:
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=time.sleep, args=(600,))  # a worker that never ends
    process.start()
    terminate(process)
    assert not process.is_alive() and process.exitcode == -15
