"""Prefetch on CPU with disk weights: exact outputs, learned order, order changes, cleanup."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.big_modeling.dispatch import cpu_offload, disk_offload, dispatch_model
from workbench.big_modeling.hooks.align import offloading_hook
from workbench.big_modeling.hooks.prefetch import Prefetcher, disable_prefetch, enable_prefetch


class Reorderable(nn.Module):
    """Square layers applied in order, or in reverse when ``reverse`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.reverse = False

    def forward(self, x):
        for layer in reversed(self.layers) if self.reverse else self.layers:
            x = torch.tanh(layer(x))
        return x


@pytest.fixture
def reference() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Reorderable().eval(), torch.randn(2, 8)


def run(model: nn.Module, x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    model.reverse = reverse
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("disk_reads", ["populate", "read", "advise"])
def test_disk_prefetch_is_exact_and_learns_the_order(reference, tmp_path: Path, disk_reads) -> None:
    model, x = reference
    expected = run(model, x)
    offloaded = disk_offload(copy.deepcopy(model), tmp_path, "cpu")
    prefetcher = enable_prefetch(offloaded, disk_reads=disk_reads)
    for _ in range(3):
        torch.testing.assert_close(run(offloaded, x), expected, rtol=0, atol=0)
    hooks = {id(h): name for name, h in ((h.module_name, h) for h in prefetcher.hooks)}
    learned = {hooks[k]: v.module_name for k, v in prefetcher.successor.items()}
    assert learned == {
        "layers.0": "layers.1",
        "layers.1": "layers.2",
        "layers.2": "layers.3",
        "layers.3": "layers.0",
    }
    assert prefetcher.hits == 7  # forward 2: all but the first module; forward 3: all four
    disable_prefetch(offloaded)
    assert prefetcher._thread is None and all(h.prefetcher is None for h in prefetcher.hooks)


def test_changed_order_stays_exact_and_is_relearned(reference, tmp_path: Path) -> None:
    model, x = reference
    forward_out, reverse_out = run(model, x), run(model, x, reverse=True)
    offloaded = disk_offload(copy.deepcopy(model), tmp_path, "cpu", prefetch=True)
    prefetcher = offloaded._wb_prefetcher
    for reverse, expected in [
        (False, forward_out),
        (False, forward_out),
        (True, reverse_out),
        (True, reverse_out),
        (False, forward_out),
    ]:
        torch.testing.assert_close(run(offloaded, x, reverse), expected, rtol=0, atol=0)
    names = {id(h): h.module_name for h in prefetcher.hooks}
    assert names[id(prefetcher.successor[id(prefetcher.hooks[0])])] == "layers.1"
    assert len(prefetcher._reads) <= prefetcher.depth  # stale reads were dropped
    disable_prefetch(offloaded)


def test_dispatch_with_prefetch_and_reentrant_module(tmp_path: Path) -> None:
    class Twice(nn.Linear):
        def forward(self, x, again=True):
            out = super().forward(x)
            return self.forward(out, again=False) if again else out

    torch.manual_seed(0)
    model = nn.Sequential(Twice(8, 8), nn.ReLU(), Twice(8, 8), nn.Linear(8, 8)).eval()
    x = torch.randn(2, 8)
    expected = model(x)
    device_map = {"0": "disk", "1": "cpu", "2": "disk", "3": "disk"}
    dispatched = dispatch_model(
        copy.deepcopy(model), device_map, offload_dir=tmp_path, prefetch=True
    )
    for _ in range(3):
        with torch.no_grad():
            torch.testing.assert_close(dispatched(x), expected, rtol=0, atol=0)
    assert isinstance(dispatched._wb_prefetcher, Prefetcher)
    assert dispatched._wb_prefetcher.hits >= 3
    disable_prefetch(dispatched)


def test_cpu_offload_prefetch_on_cpu_starts_no_thread(reference) -> None:
    model, x = reference
    expected = run(model, x)
    offloaded = cpu_offload(copy.deepcopy(model), "cpu", prefetch=True)
    torch.testing.assert_close(run(offloaded, x), expected, rtol=0, atol=0)
    torch.testing.assert_close(run(offloaded, x), expected, rtol=0, atol=0)
    assert offloaded._wb_prefetcher._thread is None  # nothing on disk: nothing to read
    disable_prefetch(offloaded)


def test_bad_disk_reads_mode() -> None:
    with pytest.raises(ValueError, match="disk_reads"):
        Prefetcher([], disk_reads="mmap")


@pytest.mark.parametrize("disk_reads", ["populate", "read"])
def test_disk_prefetch_follows_a_replaced_weights_map(
    reference, tmp_path: Path, disk_reads
) -> None:
    """peft swaps a hook's weights_map after merging adapters: a read planned or done ahead
    for the old map must not be served."""
    model, x = reference
    offloaded = disk_offload(copy.deepcopy(model), tmp_path, "cpu")
    prefetcher = enable_prefetch(offloaded, disk_reads=disk_reads)
    for _ in range(2):  # learn the order; layers.2 is now fetched ahead during layers.1
        run(offloaded, x)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.layers[2].weight.mul_(-1)
    expected = run(changed, x)
    hook = offloading_hook(offloaded.layers[2])
    hook.weights_map = {n: t.detach().clone() for n, t in changed.layers[2].named_parameters()}
    for _ in range(2):
        torch.testing.assert_close(run(offloaded, x), expected, rtol=0, atol=0)
    assert prefetcher.hits > 0
    disable_prefetch(offloaded)
