"""CUDA dispatch, offload and prefetch (side stream, pinned memory); skipped without CUDA."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.big_modeling.dispatch import (
    cpu_offload,
    disk_offload,
    dispatch_model,
)
from workbench.big_modeling.hooks.align import offloading_hook
from workbench.big_modeling.hooks.cpu_offload import cpu_offload_with_hook
from workbench.big_modeling.hooks.prefetch import disable_prefetch
from workbench.big_modeling.planning.planner import infer_auto_device_map
from workbench.big_modeling.planning.sizes import get_max_memory
from workbench.big_modeling.transfers import recording_transfers

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda", 0)


class TiedStack(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(self.norm(x))


@pytest.fixture
def case() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = TiedStack().eval()
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        expected = copy.deepcopy(model).to(CUDA)(ids.to(CUDA)).cpu()
    return model, ids, expected


def allocated() -> int:
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated(CUDA)


def test_dispatch_gpu_cpu_disk_runs_on_gpu_and_returns_to_input_device(
    case, tmp_path: Path
) -> None:
    model, ids, expected = case
    device_map = {
        "embed": 0,
        "layers.0": 0,
        "layers.1": "cpu",
        "layers.2": "disk",
        "layers.3": "cpu",
        "norm": 0,
        "head": "cpu",
    }
    dispatched = dispatch_model(copy.deepcopy(model), device_map, offload_dir=tmp_path)
    assert dispatched._hf_hook.execution_device == 0
    assert dispatched.layers[1].weight.device.type == "meta"
    with torch.no_grad():
        out = dispatched(ids)  # CPU input: the output comes back to the CPU
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, expected)
    assert dispatched.head.weight.device.type == "meta"  # tied head served from embed's copy


def test_offloaded_weights_leave_the_gpu_after_each_forward(case) -> None:
    model, ids, expected = case
    baseline = allocated()
    offloaded = cpu_offload(copy.deepcopy(model), execution_device=CUDA)
    with torch.no_grad():
        out = offloaded(ids.to(CUDA))
    torch.testing.assert_close(out.cpu(), expected)
    del out
    assert allocated() - baseline < 64 * 1024  # only non-persistent buffers may stay


def test_exception_on_gpu_frees_the_weights() -> None:
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(128, 2))  # shape error in the second
    offloaded = cpu_offload(model, execution_device=CUDA)
    baseline = allocated()
    with pytest.raises(RuntimeError), torch.no_grad():
        offloaded(torch.ones(1, 256, device=CUDA))
    assert all(p.device.type == "meta" for p in offloaded.parameters())
    assert allocated() - baseline < 256 * 256 * 4  # the first layer's 256 KiB were released


@pytest.mark.parametrize("source", ["cpu", "disk"])
def test_prefetch_on_a_side_stream_is_exact(case, tmp_path: Path, source: str) -> None:
    model, ids, expected = case
    if source == "cpu":
        offloaded = cpu_offload(copy.deepcopy(model), CUDA, prefetch=True)
    else:
        offloaded = disk_offload(copy.deepcopy(model), tmp_path, CUDA, prefetch=True)
    baseline = allocated()
    for _ in range(3):
        with torch.no_grad():
            torch.testing.assert_close(offloaded(ids.to(CUDA)).cpu(), expected)
    prefetcher = offloaded._wb_prefetcher
    assert prefetcher.hits > 0
    disable_prefetch(offloaded)
    assert allocated() - baseline < 1024 * 1024


def test_transfer_events_use_cuda_destination(case, tmp_path: Path) -> None:
    model, ids, _ = case
    offloaded = disk_offload(copy.deepcopy(model), tmp_path, CUDA)
    events = []
    with recording_transfers(events.append), torch.no_grad():
        offloaded(ids.to(CUDA))
    transfers = [e for e in events if e.kind == "transfer"]
    assert {e.destination for e in transfers} == {"cuda:0"}
    assert {e.source for e in transfers} == {"disk"}
    assert all(e.end_s >= e.start_s for e in transfers)
    # 4 x (32*32 + 32) * 4 B + LayerNorm 2*32*4 B + embed 64*32*4 B (head shares it)
    assert sum(e.nbytes for e in transfers) >= 4 * (32 * 32 + 32) * 4


def test_cpu_offload_with_hook_moves_models_in_turn() -> None:
    torch.manual_seed(0)
    first, second = nn.Linear(64, 64), nn.Linear(64, 64)
    x = torch.randn(2, 64)
    expected = second.to(CUDA)(first.to(CUDA)(x.to(CUDA))).cpu()
    first, hook1 = cpu_offload_with_hook(first.cpu(), CUDA)
    second, hook2 = cpu_offload_with_hook(second.cpu(), CUDA, prev_module_hook=hook1)
    assert first.weight.device.type == "cpu"
    y = first(x)
    assert first.weight.device == CUDA
    out = second(y)
    assert first.weight.device.type == "cpu" and second.weight.device == CUDA
    torch.testing.assert_close(out.cpu(), expected)
    hook2.offload()
    assert second.weight.device.type == "cpu"


def test_prefetch_with_transfer_timing_is_exact(case) -> None:
    """CUDA event timing on the compute stream while copies run on the prefetch side stream."""
    model, ids, expected = case
    offloaded = cpu_offload(copy.deepcopy(model), CUDA, prefetch=True)
    events = []
    with recording_transfers(events.append), torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(offloaded(ids.to(CUDA)).cpu(), expected)
    assert offloaded._wb_prefetcher.hits > 0
    transfers = [e for e in events if e.kind == "transfer"]
    assert transfers and {e.destination for e in transfers} == {"cuda:0"}
    assert all(e.end_s >= e.start_s for e in transfers)
    disable_prefetch(offloaded)


def test_prefetch_follows_a_replaced_weights_map(case) -> None:
    """peft replaces a hook's weights_map after merging adapters: the pinned copies made for
    the old weights must not be served any more."""
    model, ids, _ = case
    offloaded = cpu_offload(copy.deepcopy(model), CUDA, prefetch=True)
    with torch.no_grad():
        for _ in range(2):  # learn the order; pin the in-memory weights
            offloaded(ids.to(CUDA))
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.layers[2].weight.mul_(-1)
        expected = copy.deepcopy(changed).to(CUDA)(ids.to(CUDA)).cpu()
    hook = offloading_hook(offloaded.layers[2])
    hook.weights_map = {n: t.detach().clone() for n, t in changed.layers[2].named_parameters()}
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(offloaded(ids.to(CUDA)).cpu(), expected)
    assert offloaded._wb_prefetcher.hits > 0
    disable_prefetch(offloaded)


def test_detected_memory_plans_everything_onto_the_gpu(case) -> None:
    """``get_max_memory()`` reads free memory with ``torch.cuda.mem_get_info``; a small model
    then plans wholly onto cuda:0 and runs there."""
    model, ids, expected = case
    max_memory = get_max_memory()
    assert 0 in max_memory and "cpu" in max_memory
    assert 0 < max_memory[0] <= torch.cuda.get_device_properties(0).total_memory
    device_map = infer_auto_device_map(copy.deepcopy(model), max_memory=max_memory)
    assert set(device_map.values()) == {0}
    dispatched = dispatch_model(copy.deepcopy(model), device_map)
    with torch.no_grad():
        torch.testing.assert_close(dispatched(ids.to(CUDA)).cpu(), expected)
