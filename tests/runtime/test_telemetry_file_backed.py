"""The file-backed part of the worker's RSS: measured, carried over the pipe, kept in history.

Mapped weight files count in RSS although their pages are clean and reclaimable; the sample
says how much of the RSS they are, so the GUI can show it.
"""

from __future__ import annotations

import math
import mmap
import multiprocessing
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from workbench.runtime.protocol import CudaMemory, TelemetrySample
from workbench.runtime.telemetry import (
    MEMORY_COLUMNS,
    MemoryHistory,
    read_process_memory,
    take_memory_sample,
)
from workbench.runtime.worker import WorkerHost

MIB = 1 << 20
N_MIB = 64
SLACK = 8 * MIB  # other threads and lazy imports may move a few MiB while we measure
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RssFile is Linux")


def _touch_every_page(buffer: Any, write: bool = False) -> None:
    pages = np.frombuffer(buffer, dtype=np.uint8)[:: mmap.PAGESIZE]
    if write:
        pages[:] = 1
    else:
        assert int(pages.sum()) == len(pages) * 0x5A  # reads every page: all are resident now


def _filesystem_type(path: Path) -> str:
    """The type of the mount holding ``path`` (longest mount point that prefixes it)."""
    best, kind = "", ""
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            point = fields[1]
            inside = str(path) == point or str(path).startswith(point.rstrip("/") + "/")
            if inside and len(point) > len(best):
                best, kind = point, fields[2]
    return kind


@linux_only
def test_mapping_a_file_raises_file_backed_and_rss_by_its_size(tmp_path: Path) -> None:
    if _filesystem_type(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip("tmp_path is on tmpfs: its pages are shared memory, not file-backed")
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x5a" * (N_MIB * MIB))
    before = take_memory_sample()
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        _touch_every_page(mapped)
        during = take_memory_sample()
    after = take_memory_sample()

    assert before.file_backed_bytes is not None and during.file_backed_bytes is not None
    file_rise = during.file_backed_bytes - before.file_backed_bytes
    rss_rise = during.rss_bytes - before.rss_bytes
    assert abs(file_rise - N_MIB * MIB) < SLACK, file_rise / MIB
    assert rss_rise > N_MIB * MIB - SLACK, rss_rise / MIB
    assert during.file_backed_bytes <= during.rss_bytes
    assert after.file_backed_bytes is not None
    assert during.file_backed_bytes - after.file_backed_bytes > N_MIB * MIB - SLACK  # unmapped


@linux_only
def test_anonymous_and_shared_memory_raise_rss_but_not_file_backed() -> None:
    """Private and shared anonymous pages (``RssAnon``, ``RssShmem``) are not reclaimable
    file pages: psutil's ``shared`` counts the second, ``file_backed_bytes`` must not."""
    before = take_memory_sample()
    # fresh private pages from the kernel: a malloc'd array may reuse pages this long-lived
    # test process already holds resident, and then RSS does not grow
    with (
        mmap.mmap(-1, N_MIB * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) as private,
        mmap.mmap(-1, N_MIB * MIB) as shared,  # MAP_SHARED | MAP_ANONYMOUS: shmem
    ):
        _touch_every_page(private, write=True)
        _touch_every_page(shared, write=True)
        during = take_memory_sample()
        assert private[0] == 1
    assert before.file_backed_bytes is not None and during.file_backed_bytes is not None
    assert during.rss_bytes - before.rss_bytes > 2 * N_MIB * MIB - SLACK
    assert abs(during.file_backed_bytes - before.file_backed_bytes) < SLACK


def test_read_process_memory_agrees_with_psutil() -> None:
    rss, file_backed = read_process_memory()
    info = psutil.Process().memory_info()
    assert 0.5 * info.rss < rss < 2 * info.rss
    if sys.platform.startswith("linux"):
        assert file_backed is not None and 0 < file_backed <= rss
        assert file_backed <= info.shared + SLACK  # shared = RssFile + RssShmem
    else:
        assert file_backed is None


def test_status_without_rss_file_reports_none(tmp_path: Path) -> None:
    old_kernel = tmp_path / "status"  # before Linux 4.5 there was no RssFile line
    old_kernel.write_bytes(
        b"Name:\tpython3\nVmHWM:\t  9000 kB\nVmRSS:\t  8000 kB\nVmData:\t 1 kB\n"
    )
    assert read_process_memory(str(old_kernel)) == (8000 * 1024, None)
    modern = tmp_path / "status2"
    modern.write_bytes(b"VmRSS:\t  8000 kB\nRssAnon:\t 5000 kB\nRssFile:\t 2500 kB\n")
    assert read_process_memory(str(modern)) == (8000 * 1024, 2500 * 1024)


def test_without_proc_status_rss_comes_from_psutil_and_file_backed_is_none(tmp_path) -> None:
    rss, file_backed = read_process_memory(str(tmp_path / "no-such-status"))  # macOS, Windows
    assert file_backed is None
    assert 0.5 * psutil.Process().memory_info().rss < rss


def test_sample_with_file_backed_bytes_crosses_a_real_pipe() -> None:
    sample = TelemetrySample(
        1.5, 300 * MIB, 8000 * MIB, (CudaMemory(0, 1, 2),), file_backed_bytes=120 * MIB
    )
    receiver, sender = multiprocessing.Pipe(duplex=False)
    with receiver, sender:
        sender.send(sample)
        got = receiver.recv()
    assert got == sample and got.file_backed_bytes == 120 * MIB
    assert TelemetrySample(1.0, 2, 3).file_backed_bytes is None  # positional use is unchanged


def test_a_sample_pickled_before_the_field_existed_still_decodes() -> None:
    old = object.__new__(TelemetrySample)  # what the old class pickled: its four fields
    old.__dict__.update(time_s=2.0, rss_bytes=10, available_bytes=20, cuda=())
    decoded = pickle.loads(pickle.dumps(old))
    assert decoded.file_backed_bytes is None
    assert decoded == TelemetrySample(2.0, 10, 20)
    history = MemoryHistory(capacity=4)
    history.add(decoded)
    assert math.isnan(history.host.latest()[3])


def test_memory_history_keeps_file_backed_as_the_last_column() -> None:
    assert MEMORY_COLUMNS == ("time_s", "rss_bytes", "available_bytes", "file_backed_bytes")
    history = MemoryHistory(capacity=4)
    history.add(TelemetrySample(1.0, 100, 1000, file_backed_bytes=40))
    history.add(TelemetrySample(2.0, 110, 990))
    rows = history.host.snapshot()
    assert rows[:, :3].tolist() == [[1.0, 100.0, 1000.0], [2.0, 110.0, 990.0]]
    assert rows[0, 3] == 40.0 and math.isnan(rows[1, 3])


@linux_only
def test_worker_samples_reach_the_host_with_file_backed_bytes(events: Any) -> None:
    host = WorkerHost(events, sample_hz=50, history_capacity=16, preload_imports=False)
    try:
        host.start()
        events.wait_for(lambda e: isinstance(e, TelemetrySample))
        sample = next(e for e in events.events if isinstance(e, TelemetrySample))
    finally:
        host.shutdown(timeout_s=60)
    assert sample.file_backed_bytes is not None
    assert 0 < sample.file_backed_bytes <= sample.rss_bytes  # libpython is a mapped file
    rows = host.memory.host.snapshot()
    assert len(rows) and np.isfinite(rows[:, 3]).all() and (rows[:, 3] <= rows[:, 1]).all()
