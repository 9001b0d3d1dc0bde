"""The worker process end to end: load, generate, verify, cancel, kill, restart (real processes)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from job_holds import hold_options

from workbench.runtime.protocol import (
    Failed,
    InferenceResult,
    LoadSummary,
    Phase,
    Progress,
    Result,
    StateChanged,
    TokenStreamed,
    VerifyResult,
    WorkerExited,
)
from workbench.runtime.worker import WorkerHost, WorkerStateError

# Cancel must return within 0.5 s on an idle machine; CI shares 2 cores among many processes,
# so the assertion allows 4x that. The figure measured here is printed for the record.
CANCEL_LIMIT_S = 2.0


def _held(request_id: int):
    return lambda e: isinstance(e, Phase) and e.request_id == request_id and e.phase == "held"


def _runs(items: list[str]) -> list[str]:
    """``items`` with consecutive repeats collapsed: a, a, b, a -> a, b, a."""
    return [x for i, x in enumerate(items) if i == 0 or items[i - 1] != x]


def _states(events: Any) -> list[str]:
    return [e.state for e in events.of("StateChanged") if isinstance(e, StateChanged)]


@pytest.mark.slow
def test_load_generate_and_verify_through_the_worker(
    host: WorkerHost, events: Any, demo_dir: Path, cpu_disk_map: dict, demo_config: dict
) -> None:
    load_id = host.load(demo_dir, cpu_disk_map, dtype="float32")
    assert host.state == "loading"
    final = events.final(load_id)
    assert isinstance(final, Result), final
    summary = final.value
    assert isinstance(summary, LoadSummary)
    assert summary.model_class == "LlamaForCausalLM" and summary.is_causal_lm
    assert summary.has_tokenizer
    assert set(summary.nbytes_by_device) == {"cpu", "disk"}
    assert host.state == "loaded"
    # disk weights were cast, so they were written into the host's offload folder
    assert host.offload_folder is not None and any(host.offload_folder.iterdir())

    progress = [e for e in events.of("Progress") if isinstance(e, Progress)]
    assert progress, "no progress events"
    done = [p.bytes_done for p in progress]
    assert done == sorted(done)
    assert progress[-1].bytes_done == progress[-1].bytes_total == summary.bytes_total
    phases = [e.phase for e in events.of("Phase") if e.request_id == load_id]
    assert phases == ["building", "loading", "dispatching", "paging in", "ready"]
    progress_phases = [p.phase for p in progress]
    assert _runs(progress_phases) == ["building", "loading", "dispatching"], progress_phases

    infer_id = host.infer("The planner", max_new_tokens=6)
    result = events.final(infer_id)
    assert isinstance(result, Result), result
    value = result.value
    assert isinstance(value, InferenceResult)
    tokens = [e for e in events.of("TokenStreamed") if isinstance(e, TokenStreamed)]
    assert [t.index for t in tokens] == list(range(6))
    assert "".join(t.text for t in tokens) == value.text
    assert value.new_tokens == 6 and value.prompt_tokens >= 1
    assert value.ttft_s > 0 and value.tokens_per_s > 0
    disk_layers = [t for t in value.per_layer if t.source == "disk" and t.nbytes > 0]
    streamed_in = {name.split(".")[2] for name, dev in cpu_disk_map.items() if dev == "disk"}
    assert {t.module.split(".")[2] for t in disk_layers} == streamed_in  # every disk layer
    assert all(t.transfer_s > 0 for t in disk_layers)
    # every timed block (a decoder layer) computed for a measurable time
    blocks = {f"model.layers.{i}" for i in range(demo_config["num_hidden_layers"])}
    timed = {t.module: t.compute_s for t in value.per_layer if t.module in blocks}
    assert set(timed) == blocks and all(s > 0 for s in timed.values()), timed
    # per_layer covers the last forward only: each disk weight was streamed in exactly once
    assert sum(t.nbytes for t in disk_layers) == summary.nbytes_by_device["disk"]
    assert len({t.module for t in value.per_layer}) == len(value.per_layer)
    assert "tokens_per_s" in value.predicted  # the speed model's figure, stored beside ours
    assert host.transfers.last_forward(), "transfer history not fed"
    assert len(host.memory.host) > 0, "no telemetry samples arrived"

    verify_id = host.verify("The planner")
    checked = events.final(verify_id)
    assert isinstance(checked, Result) and isinstance(checked.value, VerifyResult)
    assert checked.value.passed and checked.value.exact  # CPU math is identical: bitwise equal
    assert _states(events) == [
        "idle",
        "loading",
        "loaded",
        "running",
        "loaded",
        "running",
        "loaded",
    ]

    folder = host.offload_folder
    host.unload()
    assert host.state == "idle"
    assert not folder.exists()
    with pytest.raises(WorkerStateError, match="no model is loaded"):
        host.infer("again")


@pytest.mark.slow
def test_bad_source_then_cancel_mid_load_returns_fast_and_leaves_nothing(
    host: WorkerHost, events: Any, demo_dir: Path, cpu_disk_map: dict, tmp_path: Path
) -> None:
    bad_id = host.load(tmp_path / "missing", {"": "cpu"})
    failed = events.final(bad_id)
    assert isinstance(failed, Failed) and failed.kind == "bad_input"
    assert "missing" in failed.message
    assert host.state == "idle"
    assert not host.cancel()  # nothing runs

    load_id = host.load(demo_dir, cpu_disk_map, dtype="float32", options=hold_options(20))
    folder = host.offload_folder
    events.wait_for(_held(load_id))
    assert any(folder.iterdir()), "the hold should come after some disk weights were written"
    # the progress of the 20 tensors is flushed before the hold, not left behind the throttle
    progress = [e for e in events.of("Progress") if e.request_id == load_id]
    assert progress and 0 < progress[-1].bytes_done < progress[-1].bytes_total
    assert progress[-1].tensor, progress[-1]
    with pytest.raises(WorkerStateError, match="cancel it first"):
        host.load(demo_dir, cpu_disk_map)
    start = time.perf_counter()
    assert host.cancel()
    final = events.final(load_id)
    cancel_s = time.perf_counter() - start
    print(f"cancel returned in {cancel_s * 1000:.0f} ms")
    assert isinstance(final, Failed) and final.kind == "cancelled", final
    assert cancel_s < CANCEL_LIMIT_S
    assert not folder.exists()
    assert list((tmp_path / "offload").iterdir()) == []
    # cooperative, and the worker that held the half-loaded model was replaced by a fresh one
    assert host.state == "idle" and host.is_alive()
    pid = host.pid
    assert pid not in host.retired_pids and len(host.retired_pids) == 2  # the bad load too

    again = host.load(demo_dir, {"": "cpu"}, dtype="float32")
    assert isinstance(events.final(again), Result)
    assert host.pid == pid and host.state == "loaded"


@pytest.mark.slow
def test_worker_death_and_unanswered_cancel_are_reported_and_recovered(
    host: WorkerHost, events: Any, demo_dir: Path, cpu_disk_map: dict
) -> None:
    load_id = host.load(demo_dir, cpu_disk_map, dtype="float32", options=hold_options(20))
    folder = host.offload_folder
    events.wait_for(_held(load_id))
    os.kill(host.pid, signal.SIGKILL)
    exited = events.wait_for(lambda e: isinstance(e, WorkerExited))
    assert exited.signal == signal.SIGKILL and not exited.expected
    assert "killed by signal 9" in exited.message
    failed = events.final(load_id)
    assert isinstance(failed, Failed) and failed.kind == "worker_died"
    assert "killed by signal 9 (SIGKILL)" in failed.details, failed.details
    assert "last phase: held" in failed.details
    last = [e for e in events.of("Progress") if e.request_id == load_id][-1]
    assert f"last tensor: {last.tensor}" in failed.details and last.tensor
    assert host.state == "stopped" and host.pid is None
    assert not folder.exists()

    again = host.load(demo_dir, cpu_disk_map, dtype="float32")  # restarts the worker
    assert isinstance(events.final(again), Result)
    assert host.state == "loaded"

    # a job that ignores cancel: the host terminates the worker after the grace period
    host.cancel_grace_s = 0.5
    stuck = host.load(
        demo_dir,
        cpu_disk_map,
        dtype="float32",
        options=hold_options(5, ignore_cancel=True),
    )
    folder = host.offload_folder
    events.wait_for(_held(stuck))
    host.cancel()
    failed = events.final(stuck)
    assert isinstance(failed, Failed) and failed.kind == "cancelled"
    assert "terminated" in failed.message
    exited = events.wait_for(lambda e: isinstance(e, WorkerExited) and e.expected)
    assert exited.signal == signal.SIGTERM
    assert host.state == "stopped"
    assert not folder.exists()


def test_telemetry_stays_bounded_over_a_long_run(events: Any) -> None:
    host = WorkerHost(events, sample_hz=200, history_capacity=16, preload_imports=False)
    try:
        host.start()
        nbytes = host.memory.nbytes
        events.wait_for(lambda e: host.memory.host.total_appended >= 80)
        assert len(host.memory.host) == 16
        assert host.memory.nbytes == nbytes
        times = host.memory.host.snapshot()[:, 0]
        assert (times[1:] >= times[:-1]).all()
    finally:
        host.shutdown(timeout_s=60)  # generous: a loaded CI machine may be slow to schedule it
    assert host.state == "stopped"
    exited = events.wait_for(lambda e: isinstance(e, WorkerExited))
    assert exited.expected and exited.exitcode == 0, exited
