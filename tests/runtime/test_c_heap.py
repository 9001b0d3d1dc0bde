"""The worker's heap policy: glibc's dynamic mmap threshold keeps freed activation-sized blocks
resident (and says how many), a fixed one returns them to the system (in fresh processes)."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.conftest import EventLog
from workbench.runtime.c_heap import heap_policy
from workbench.runtime.protocol import Result
from workbench.runtime.worker import WorkerHost

MIB = 2**20


def _has_mallopt() -> bool:
    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "mallopt")
    except OSError:
        return False


# A large block freed (glibc's dynamic threshold then rises to its size), then twenty 1 MiB
# blocks of which the last stays live (it pins the heap's top): the anonymous bytes the
# nineteen freed ones still hold.
_RETENTION = """
import json, torch
from workbench.runtime.c_heap import apply_heap_policy, heap_free_bytes
from workbench.runtime.memory_readings import read_anonymous_bytes
applied = apply_heap_policy()
big = torch.ones(8 * 2**20 // 4); del big
blocks = [torch.ones(2**20 // 4) for _ in range(20)]
live = read_anonymous_bytes()
del blocks[:-1]
kept = read_anonymous_bytes() - (live - 19 * 2**20)
print(json.dumps({"applied": applied, "kept": kept, "free": heap_free_bytes()}))
"""


def _freed_bytes_kept(policy: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop("WORKBENCH_MMAP_THRESHOLD", None)
    if policy is not None:
        env["WORKBENCH_MMAP_THRESHOLD"] = policy
    done = subprocess.run(
        [sys.executable, "-c", _RETENTION], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(not _has_mallopt(), reason="no glibc mallopt")
def test_a_fixed_threshold_returns_freed_blocks_that_the_dynamic_one_keeps() -> None:
    dynamic = _freed_bytes_kept(None)  # the worker's default: glibc's
    fixed = _freed_bytes_kept("131072")
    assert dynamic["applied"] is None and fixed["applied"] == 131072
    # glibc's default keeps the nineteen freed MiB in the heap, and mallinfo2 counts them
    assert dynamic["kept"] > 15 * MIB, dynamic
    assert 19 * MIB <= dynamic["free"] < 21 * MIB, dynamic
    # fixed at 128 KiB, each 1 MiB block was mapped on its own and unmapped when freed
    assert fixed["kept"] < 2 * MIB and fixed["free"] < 2 * MIB, fixed


def test_the_policy_reads_the_environment() -> None:
    assert heap_policy({}) is None  # glibc's dynamic threshold
    assert heap_policy({"WORKBENCH_MMAP_THRESHOLD": "1048576"}) == 1048576
    assert heap_policy({"WORKBENCH_MMAP_THRESHOLD": " Dynamic "}) is None
    # glibc's own tunable is the user's choice: the worker leaves it alone
    assert heap_policy({"MALLOC_MMAP_THRESHOLD_": "65536"}) is None


@pytest.mark.parametrize("value", ["lots", "-1", "1.5"])
def test_a_bad_setting_names_the_variable_and_the_choices(value: str) -> None:
    with pytest.raises(ValueError, match=r"WORKBENCH_MMAP_THRESHOLD=.*size in bytes.*dynamic"):
        heap_policy({"WORKBENCH_MMAP_THRESHOLD": value})


def _run_notes(events: Any, demo_dir: Path, tmp_path: Path) -> list[str]:
    host = WorkerHost(events, offload_root=tmp_path / "offload")
    try:
        assert isinstance(events.final(host.load(demo_dir, {"": "cpu"}, dtype="float32")), Result)
        final = events.final(
            host.infer(" ".join(["The capital of France is"] * 44), max_new_tokens=2)
        )
    finally:
        host.shutdown()
    assert isinstance(final, Result), final
    return list(final.value.memory.notes)


@pytest.mark.slow
@pytest.mark.skipif(not _has_mallopt(), reason="no glibc mallopt")
def test_a_run_says_what_the_heap_kept_unless_the_threshold_is_fixed(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("WORKBENCH_MMAP_THRESHOLD", raising=False)
    notes = _run_notes(EventLog(), demo_dir, tmp_path)
    heap = [note for note in notes if note.startswith("cpu heap: the C allocator held ")]
    # a long prompt's activations (about 580 tokens), freed into glibc's heap: several MiB
    assert len(heap) == 1, notes
    monkeypatch.setenv("WORKBENCH_MMAP_THRESHOLD", "131072")  # the spawned worker reads it
    notes = _run_notes(EventLog(), demo_dir, tmp_path)
    assert not any(note.startswith("cpu heap: ") for note in notes), notes


@pytest.mark.slow
def test_a_repeated_run_measures_its_own_peak_not_the_last_runs_freed_heap(
    events: Any, demo_dir: Path, tmp_path: Path
) -> None:
    # the heap is trimmed as each run begins: a second run of the same prompt reusing the
    # first one's freed blocks would have them in its baseline and out of its peak
    host = WorkerHost(events, offload_root=tmp_path / "offload")
    prompt = " ".join(["The capital of France is"] * 44)
    reserves = []
    try:
        assert isinstance(events.final(host.load(demo_dir, {"": "cpu"}, dtype="float32")), Result)
        for _ in range(3):
            final = events.final(host.infer(prompt, max_new_tokens=2))
            assert isinstance(final, Result), final
            cpu = final.value.memory.device("cpu")
            reserves.append((cpu.measured_bytes - cpu.measured_weights_bytes, cpu))
    finally:
        host.shutdown()
    first = reserves[0][1]
    for measured, cpu in reserves[1:]:
        # the same KV cache and activations: the later runs' prediction lacks only the first
        # run's matmul workspace, and their measured reserve covers that prediction
        assert cpu.predicted_reserve_bytes <= first.predicted_reserve_bytes
        assert measured >= 0.95 * cpu.predicted_reserve_bytes, (measured, cpu)
