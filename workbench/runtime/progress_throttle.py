"""Turn the engine's ``LoadProgress`` reports into the worker's ``Progress`` events, throttled.

A load reports every tensor (and a quantized load every module); the GUI needs ~20 updates a
second, each with the phase's bytes and an ETA counted from the start of that phase.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from workbench.big_modeling.progress import LoadProgress
from workbench.runtime.protocol import Event, Progress

__all__ = ["PROGRESS_INTERVAL_S", "ProgressThrottle"]

PROGRESS_INTERVAL_S = 0.05  # ~20 Hz


class ProgressThrottle:
    """Turns engine ``LoadProgress`` reports into ``Progress`` events at most every 50 ms.

    Phase changes and the final report always pass. The ETA counts from the start of the
    report's phase (quantizing has its own bytes and pace), taken as the previous phase's last
    report. Also counts the tensors reported, and calls ``on_tensor`` with that count after
    every report (a load observer's callback).
    """

    def __init__(
        self,
        emit: Callable[[Event], None],
        request_id: int,
        *,
        interval_s: float = PROGRESS_INTERVAL_S,
        on_tensor: Callable[[int], None] | None = None,
    ) -> None:
        self._emit = emit
        self._request_id = request_id
        self.interval_s = interval_s
        self._last_emit_s = 0.0
        self._last_phase = ""
        self._last_tensor = ""
        self._start_s = self._last_report_s = time.monotonic()
        self._phase = ""
        self.on_tensor = on_tensor
        self.tensors_seen = 0
        self.events_sent = 0
        self.last: LoadProgress | None = None

    def __call__(self, report: LoadProgress) -> None:
        self.last = report
        if report.tensor_name and report.tensor_name != self._last_tensor:
            self._last_tensor = report.tensor_name
            self.tensors_seen += 1
        now = time.monotonic()
        if report.phase != self._phase:
            if self._phase:
                self._start_s = self._last_report_s
            self._phase = report.phase
        self._last_report_s = now
        final = report.bytes_total > 0 and report.bytes_done >= report.bytes_total
        if report.phase != self._last_phase or final or now - self._last_emit_s >= self.interval_s:
            self._send(report, now)
        if self.on_tensor is not None:
            self.on_tensor(self.tensors_seen)

    def flush(self) -> None:
        if self.last is not None:
            self._send(self.last, time.monotonic())

    def _send(self, report: LoadProgress, now: float) -> None:
        elapsed = now - self._start_s
        eta = None
        if 0 < report.bytes_done < report.bytes_total and elapsed > 0:
            eta = elapsed * (report.bytes_total - report.bytes_done) / report.bytes_done
        self._last_emit_s = now
        self._last_phase = report.phase
        self.events_sent += 1
        self._emit(
            Progress(
                request_id=self._request_id,
                bytes_done=report.bytes_done,
                bytes_total=report.bytes_total,
                tensor=report.tensor_name,
                phase=report.phase,
                eta_s=eta,
            )
        )
