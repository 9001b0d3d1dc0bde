"""Ring buffers, memory history, the sampler and the transfer recorder."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from workbench.big_modeling.transfers import TransferEvent, recording_transfers
from workbench.runtime.protocol import CudaMemory, TelemetrySample, TransferBatch
from workbench.runtime.telemetry import (
    MemoryHistory,
    MemorySampler,
    RingBuffer,
    TransferHistory,
    TransferRecorder,
    summarize_layers,
    take_memory_sample,
)


def test_ring_buffer_keeps_the_newest_rows_in_order() -> None:
    buf = RingBuffer(4, width=2)
    assert buf.snapshot().shape == (0, 2)
    assert buf.latest() is None
    for i in range(10):
        buf.append((i, i * i))
    assert len(buf) == 4
    assert buf.total_appended == 10
    np.testing.assert_array_equal(buf.snapshot()[:, 0], [6, 7, 8, 9])
    np.testing.assert_array_equal(buf.snapshot(last=2)[:, 1], [64, 81])
    np.testing.assert_array_equal(buf.latest(), [9, 81])
    snap = buf.snapshot()
    buf.append((100, 100))
    assert snap[-1, 0] == 9  # a snapshot is a copy, not a view


def test_ring_buffer_memory_is_fixed_over_a_long_run() -> None:
    buf = RingBuffer(1000, width=3)
    nbytes = buf.nbytes  # 2 x 1000 rows * 3 * 8 B: room to keep the rows contiguous
    assert nbytes == 48_000
    for i in range(50_000):
        buf.append((i, i, i))
    assert buf.nbytes == nbytes
    assert len(buf) == 1000
    assert buf.snapshot()[0, 0] == 49_000


def test_ring_buffer_concurrent_append_and_snapshot() -> None:
    buf = RingBuffer(64, width=1)
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            buf.append(i)
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(200):
            rows = buf.snapshot()[:, 0]
            # rows are consecutive integers: no torn or reordered reads
            assert np.all(np.diff(rows) == 1)
    finally:
        stop.set()
        thread.join()


def test_ring_buffer_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="capacity and width"):
        RingBuffer(0)


def test_memory_history_adds_gpu_series_only_when_sampled() -> None:
    history = MemoryHistory(capacity=8)
    history.add(TelemetrySample(time_s=1.0, rss_bytes=100, available_bytes=1000))
    assert history.cuda_devices() == []
    history.add(
        TelemetrySample(
            time_s=2.0,
            rss_bytes=110,
            available_bytes=990,
            cuda=(CudaMemory(device=0, allocated_bytes=5, reserved_bytes=8),),
        )
    )
    assert history.cuda_devices() == [0]
    row = history.cuda(0).latest()
    assert row[:3].tolist() == [2.0, 5.0, 8.0]
    assert np.isnan(row[3])  # no NVML figure
    np.testing.assert_array_equal(history.host.snapshot()[:, 1], [100, 110])
    with pytest.raises(KeyError):
        history.cuda(1)


def test_take_memory_sample_measures_this_process() -> None:
    import psutil

    sample = take_memory_sample()
    rss = psutil.Process().memory_info().rss
    assert 0.5 * rss < sample.rss_bytes < 2 * rss
    assert sample.available_bytes > 0
    import torch

    expected = torch.cuda.device_count() if torch.cuda.is_initialized() else 0
    assert len(sample.cuda) == expected  # GPU series only once CUDA is in use


def test_sampler_emits_until_stopped() -> None:
    got: list[TelemetrySample] = []
    enough = threading.Event()

    def collect(sample: TelemetrySample) -> None:
        got.append(sample)
        if len(got) >= 3:
            enough.set()

    sampler = MemorySampler(collect, rate_hz=100)
    sampler.start()
    try:
        assert enough.wait(30)
    finally:
        sampler.stop()
    count = len(got)
    assert sampler.samples_taken == count
    assert all(b.time_s >= a.time_s for a, b in itertools.pairwise(got))
    with pytest.raises(ValueError, match="rate_hz"):
        MemorySampler(collect, rate_hz=0)


def _event(module: str, kind: str, start: float, end: float, nbytes: int = 0) -> TransferEvent:
    return TransferEvent(module, nbytes, "disk", "cpu", start, end, kind=kind)


def test_recorder_batches_and_summarizes_per_layer() -> None:
    recorder = TransferRecorder()
    with recording_transfers(recorder):
        from workbench.big_modeling import transfers

        transfers.get_transfer_recorder()(_event("layers.0", "transfer", 0.0, 0.5, 1_000_000_000))
        transfers.get_transfer_recorder()(_event("layers.0", "compute", 0.5, 0.75))
        transfers.get_transfer_recorder()(_event("layers.1", "transfer", 1.0, 1.25, 500_000_000))
    batch = recorder.drain(request_id=7, forward_index=3)
    assert (batch.request_id, batch.forward_index, len(batch.events)) == (7, 3, 3)
    assert recorder.drain(7, 4).events == ()
    layers = summarize_layers(batch.events)
    assert [layer.module for layer in layers] == ["layers.0", "layers.1"]
    assert layers[0].transfer_s == 0.5 and layers[0].compute_s == 0.25
    assert layers[0].gbps == pytest.approx(2.0)  # 1e9 B / 0.5 s = 2 GB/s
    assert layers[1].gbps == pytest.approx(2.0)  # 5e8 B / 0.25 s


def test_recorder_drops_oldest_when_not_drained() -> None:
    recorder = TransferRecorder(max_pending=10)
    for i in range(25):
        recorder(_event(f"m{i}", "transfer", 0, 1, 1))
    batch = recorder.drain(1, 0)
    assert [e.module for e in batch.events] == [f"m{i}" for i in range(15, 25)]
    assert recorder.dropped == 15


def test_transfer_history_is_bounded_and_keeps_last_forward() -> None:
    history = TransferHistory(capacity=100)
    nbytes = history.events.nbytes
    for forward in range(500):
        events = tuple(
            _event(f"model.layers.{i}", "transfer", forward, forward + 0.001, 1000)
            for i in range(4)
        )
        history.add(TransferBatch(request_id=1, forward_index=forward, events=events))
    assert len(history.events) == 100
    assert history.events.nbytes == nbytes
    assert history.module_names() == [f"model.layers.{i}" for i in range(4)]
    assert history.last_forward_index == 499
    assert [t.module for t in history.last_forward()] == history.module_names()
    rows = history.events.snapshot()
    assert rows[-1, 0] == 499 and history.module_name(int(rows[-1, 1])) == "model.layers.3"


def test_transfer_history_reset_forgets_names_so_loads_do_not_grow_it() -> None:
    history = TransferHistory(capacity=100)
    for load in range(3):  # a model with other module names at each load
        history.reset()
        events = tuple(
            _event(f"model{load}.layers.{i}", "transfer", 0.0, 0.001, 1000) for i in range(4)
        )
        history.add(TransferBatch(request_id=load, forward_index=0, events=events))
        assert history.module_names() == [f"model{load}.layers.{i}" for i in range(4)]
        assert len(history.events) == 4
    history.reset()
    assert history.module_names() == [] and history.last_forward() == ()
    assert history.last_forward_index == -1 and len(history.events) == 0
