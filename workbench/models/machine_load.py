"""How much of the machine other processes used while a probe measured.

A host probe (``dispatch_probe``, ``matmul_probe``, ``device_probe``'s kernels) times small
operations; other processes on the same cores slow them: on this project's 2-core CPU the
dispatch probe measured 74 us per module call while a model loaded beside it, 35 us idle. Each
probe states the share of the machine the others took during its timed part (``OtherLoad``),
and the probe cache (``cache_dirs.cached_probe``) measures a contended entry again later, keeping
whichever measurement was less contended.

Example:
    >>> with OtherLoad() as load:
    ...     _ = sum(range(100_000))
    >>> load.share is None or 0.0 <= load.share <= 1.0
    True
"""

from __future__ import annotations

import os
import time
from types import TracebackType

import psutil

__all__ = ["BUSY_SHARE", "OtherLoad", "contended"]

BUSY_SHARE = 0.25
"""Above this share of the machine taken by other processes, a probe's figures are contended."""


def _machine_busy_s() -> float:
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    return sum(times) - idle - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


def _own_s() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


class OtherLoad:
    """A ``with`` block's share of the machine that other processes used: their CPU seconds
    over the block's wall seconds times the logical CPUs (``share``: 0 idle, 1 every core busy;
    ``None`` where the system does not say)."""

    def __init__(self) -> None:
        self.share: float | None = None
        self._start: tuple[float, float, float] | None = None

    def __enter__(self) -> OtherLoad:
        try:
            self._start = (time.perf_counter(), _machine_busy_s(), _own_s())
        except (psutil.Error, OSError, AttributeError):
            self._start = None
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._start is None:
            return
        try:
            wall = time.perf_counter() - self._start[0]
            others = (_machine_busy_s() - self._start[1]) - (_own_s() - self._start[2])
        except (psutil.Error, OSError, AttributeError):
            return
        capacity = wall * (os.cpu_count() or 1)
        if capacity > 0:
            self.share = min(1.0, max(0.0, others / capacity))


def contended(probe: object) -> bool:
    """Whether ``probe`` (a probe dataclass) says others took more than ``BUSY_SHARE`` of the
    machine while it measured (a probe that does not say is not)."""
    share = getattr(probe, "others_busy", None)
    return share is not None and share > BUSY_SHARE
