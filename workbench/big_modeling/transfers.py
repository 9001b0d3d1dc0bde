"""Weight-transfer and compute events, reported by the hooks to an optional recorder.

With no recorder installed, a hook pays one global read (``_recorder is None``). The runtime
installs a recorder in the worker and turns events into per-layer latency plots.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class TransferEvent:
    """One weight transfer (``kind="transfer"``) or one module forward (``kind="compute"``).

    Times are seconds on ``time.perf_counter``'s clock; on CUDA the hooks convert CUDA event
    timings onto it. ``source``/``destination`` use device-map spelling ("disk", "cpu", "cuda:0").
    """

    module: str
    nbytes: int
    source: str
    destination: str
    start_s: float
    end_s: float
    kind: str = "transfer"

    @property
    def duration_s(self) -> float:
        return max(0.0, self.end_s - self.start_s)

    @property
    def gbps(self) -> float:
        """Achieved bandwidth in GB/s (decimal), 0 for compute events or zero durations."""
        return self.nbytes / self.duration_s / 1e9 if self.duration_s > 0 and self.nbytes else 0.0


TransferRecorder = Callable[[TransferEvent], None]

_recorder: TransferRecorder | None = None


def get_transfer_recorder() -> TransferRecorder | None:
    """Return the recorder hooks report to, or ``None``."""
    return _recorder


def set_transfer_recorder(recorder: TransferRecorder | None) -> TransferRecorder | None:
    """Install ``recorder`` (``None`` turns reporting off); return the previous one."""
    global _recorder
    previous, _recorder = _recorder, recorder
    return previous


@contextmanager
def recording_transfers(recorder: TransferRecorder) -> Iterator[TransferRecorder]:
    """Report every transfer inside the block to ``recorder``; restore the previous one after."""
    previous = set_transfer_recorder(recorder)
    try:
        yield recorder
    finally:
        set_transfer_recorder(previous)
