"""``machine_load``: a probe states how much of the machine other processes took while it timed,
and the probe cache measures a contended entry again later, keeping the quieter measurement."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from workbench.models.cache_dirs import (
    CONTENDED_RETRY_S,
    cached_probe,
    read_measurement_cache,
    write_measurement_cache,
)
from workbench.models.dispatch_probe import DispatchOverhead
from workbench.models.host_measurements import HostMeasurements
from workbench.models.machine_load import BUSY_SHARE, OtherLoad, contended

SPIN = "import os\nwhile True:\n    os.getpid()"


def _burn(cpu_s: float) -> None:
    """Burn ``cpu_s`` of this process's CPU time (the block's own work, not counted)."""
    own = psutil.Process()
    start = sum(own.cpu_times()[:2])
    while sum(own.cpu_times()[:2]) - start < cpu_s:
        sum(range(10_000))


def test_other_processes_spinning_on_every_core_are_seen() -> None:
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(os.cpu_count() or 1)]
    try:
        with OtherLoad() as load:
            _burn(0.5)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert load.share is not None and load.share > BUSY_SHARE


def test_a_block_alone_sees_no_more_than_the_machine_gives() -> None:
    with OtherLoad() as load:
        sum(range(100_000))
    assert load.share is None or 0.0 <= load.share <= 1.0


@dataclass(frozen=True)
class Probe:
    value: float
    measured_at: float
    others_busy: float | None = None


def _cached(path: Path, measure, *, measure_if_missing: bool = True) -> Probe | None:
    return cached_probe(
        path, "machines", "this cpu", Probe, measure, measure_if_missing=measure_if_missing,
        what="test probe",
    )  # fmt: skip


def test_a_contended_entry_is_measured_again_later_and_the_quieter_one_kept(
    tmp_path: Path,
) -> None:
    path = tmp_path / "probe.json"
    long_ago = time.time() - CONTENDED_RETRY_S - 1
    busy = Probe(74.0, long_ago, others_busy=0.6)
    assert contended(busy) and not contended(Probe(35.0, 0.0, 0.1))
    assert not contended(Probe(35.0, 0.0))  # an entry from before the figure: not known
    assert _cached(path, lambda: busy) == busy  # the first measurement, however busy
    calls = []

    def still_busy() -> Probe:
        calls.append(1)
        return Probe(80.0, time.time(), others_busy=0.7)

    kept = _cached(path, still_busy)  # due: measured again, but under more load
    assert len(calls) == 1 and kept.value == 74.0 and kept.measured_at > long_ago
    assert _cached(path, still_busy) == kept and len(calls) == 1  # not due again yet
    assert _cached(path, still_busy, measure_if_missing=False) == kept
    stored = read_measurement_cache(path, "machines")["this cpu"]
    stored["measured_at"] = long_ago  # due again
    write_measurement_cache(path, "machines", {"this cpu": stored})
    quiet = Probe(35.0, time.time(), others_busy=0.05)
    assert _cached(path, lambda: quiet) == quiet  # the quieter measurement replaces it
    assert _cached(path, still_busy) == quiet  # and, not contended, stays


def test_a_contended_probe_says_so_in_its_line() -> None:
    busy = DispatchOverhead(74e-6, 1e-3, 2, 0.0, others_busy=0.55)
    quiet = DispatchOverhead(35e-6, 1e-3, 2, 0.0, others_busy=0.02)
    assert "other processes took 55% of the CPU" in HostMeasurements(busy, None, None).lines()[0]
    assert "other processes" not in HostMeasurements(quiet, None, None).lines()[0]
