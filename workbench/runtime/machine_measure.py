"""Measure this machine again from the window: ``workbench measure --json`` in a child process.

The probes run torch (the dispatch and matmul probes in processes of their own, the CPU kernel
probe in the command's), which the GUI process never does; the child can be killed at any
moment, which is how Cancel stops it (nothing is cached then but probes already finished).

Example:
    >>> measurement = MachineMeasurement()  # doctest: +SKIP
    >>> measurement.run().lines()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading

from workbench.big_modeling.errors import LoadCancelled
from workbench.models.host_measurements import HostMeasurements

__all__ = ["MachineMeasurement"]

_TIMEOUT_S = 600


class MachineMeasurement:
    """One run of ``workbench measure``; ``run`` on a worker thread, ``cancel`` from any."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self.cancelled = False
        self.started = threading.Event()  # set once the child process runs

    def run(self) -> HostMeasurements:
        """Measure and return the figures (each also cached for the detected profile).

        Raises:
            LoadCancelled: ``cancel`` was called.
            RuntimeError: the command failed or printed no figures (its stderr's tail).
        """
        with self._lock:
            if self.cancelled:
                raise LoadCancelled("measuring this machine cancelled")
            self._process = subprocess.Popen(
                [sys.executable, "-m", "workbench", "measure", "--json"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=os.name == "posix",  # its probe processes die with it
            )
        self.started.set()
        try:
            out, err = self._process.communicate(timeout=_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            _kill_group(self._process)
            self._process.communicate()
            raise RuntimeError(f"measuring this machine took over {_TIMEOUT_S} s") from exc
        if self.cancelled:
            raise LoadCancelled("measuring this machine cancelled")
        try:
            data = json.loads(out)
        except json.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            tail = "\n".join(err.strip().splitlines()[-5:])
            raise RuntimeError(f"workbench measure exited with {self._process.returncode}: {tail}")
        return HostMeasurements.from_dict(data)

    @property
    def exit_code(self) -> int | None:
        """The child's exit status once it ended (``-9`` after a cancel), else ``None``."""
        return None if self._process is None else self._process.returncode

    def cancel(self) -> None:
        """Stop the measurement (kills the child process); ``run`` raises ``LoadCancelled``."""
        with self._lock:
            self.cancelled = True
            if self._process is not None and self._process.poll() is None:
                _kill_group(self._process)


def _kill_group(process: subprocess.Popen[str]) -> None:
    """Kill ``process`` and, on POSIX, the probe processes it started (its session)."""
    if os.name == "posix":
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    else:
        process.kill()
