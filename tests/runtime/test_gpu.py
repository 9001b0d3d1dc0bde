"""CUDA paths of the runtime (run by the lead on a GPU machine; skipped without CUDA)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from workbench.runtime.protocol import InferenceResult, Result, VerifyResult, WorkerExited
from workbench.runtime.telemetry import take_memory_sample
from workbench.runtime.worker import WorkerHost

pytestmark = pytest.mark.gpu


def _gpu_map(demo_config: dict) -> dict[str, object]:
    """Half the layers on cuda:0, the next on the CPU (offloaded), the last on disk."""
    layers = demo_config["num_hidden_layers"]
    device_map: dict[str, object] = {"model.embed_tokens": 0, "model.rotary_emb": 0}
    for i in range(layers):
        device_map[f"model.layers.{i}"] = 0 if i < layers // 2 else "cpu"
    device_map[f"model.layers.{layers - 1}"] = "disk"
    device_map |= {"model.norm": 0, "lm_head": 0}
    return device_map


def test_memory_sample_reports_cuda_allocations() -> None:
    torch.cuda.init()  # the sampler reports CUDA only once this process has initialised it
    before = take_memory_sample().cuda[0].allocated_bytes
    block = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda:0")  # 64 MiB
    sample = take_memory_sample()
    assert len(sample.cuda) == torch.cuda.device_count()
    mem = sample.cuda[0]
    assert mem.allocated_bytes - before >= 64 * 2**20
    assert mem.reserved_bytes >= mem.allocated_bytes
    assert mem.total_bytes and mem.total_bytes > mem.reserved_bytes
    del block


def test_gpu_offload_through_the_worker(
    events: Any, demo_dir: Path, demo_config: dict, tmp_path: Path
) -> None:
    host = WorkerHost(events, offload_root=tmp_path, sample_hz=20)
    try:
        load_id = host.load(demo_dir, _gpu_map(demo_config), dtype="float16")
        assert isinstance(events.final(load_id), Result)
        infer_id = host.infer("The planner", max_new_tokens=4)
        final = events.final(infer_id)
        assert isinstance(final, Result), final
        result = final.value
        assert isinstance(result, InferenceResult) and result.new_tokens == 4
        moved = [t for t in result.per_layer if t.nbytes > 0]
        assert {t.destination for t in moved} == {"cuda:0"}
        assert {t.source for t in moved} >= {"cpu", "disk"}
        events.wait_for(lambda e: bool(host.memory.cuda_devices()))
        allocated = host.memory.cuda(0).snapshot()[:, 1]
        assert allocated.max() > 0  # the worker's own CUDA memory, seen from the host

        verify_id = host.verify("The planner", atol=5e-2, rtol=5e-2)
        checked = events.final(verify_id)
        assert isinstance(checked, Result) and isinstance(checked.value, VerifyResult)
        assert checked.value.passed, checked.value

        pid = host.pid
        host.unload()  # a new process: every byte of GPU memory is given back
        assert host.pid != pid and host.state == "idle"
        exited = events.wait_for(lambda e: isinstance(e, WorkerExited))
        assert exited.expected and exited.signal in (None, signal.SIGTERM)
    finally:
        host.shutdown()
    assert list(tmp_path.iterdir()) == []
