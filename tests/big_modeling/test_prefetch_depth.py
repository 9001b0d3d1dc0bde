"""Prefetch on CPU with disk weights: depth bounds what is held, discard, populate, failures."""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from workbench.big_modeling.dispatch import disk_offload
from workbench.big_modeling.errors import CheckpointError
from workbench.big_modeling.hooks import prefetch_reader
from workbench.big_modeling.hooks.prefetch import Prefetcher, disable_prefetch, enable_prefetch
from workbench.big_modeling.hooks.prefetch_reader import MapJob, is_cached, populate


def stack(layers: int = 6, dim: int = 8) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(dim, dim) for _ in range(layers)]).eval(), torch.randn(2, dim)


def forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_depth_bounds_the_modules_held_ahead(tmp_path: Path, depth: int) -> None:
    model, x = stack()
    expected = forward(model, x)
    offloaded = disk_offload(copy.deepcopy(model), tmp_path, "cpu")
    prefetcher = enable_prefetch(offloaded, depth=depth)
    names = {id(hook): hook.module_name for hook in prefetcher.hooks}
    held: list[list[str]] = []
    for layer in offloaded:  # after the layer's forward: after its ``take``, before the next
        layer.register_forward_hook(lambda *_: held.append([names[k] for k in prefetcher._reads]))
    for _ in range(3):
        torch.testing.assert_close(forward(offloaded, x), expected, rtol=0, atol=0)
    # from the second forward on, each module holds exactly its next ``depth`` modules
    for position, ahead in enumerate(held[6:]):
        assert ahead == [str((position + k) % 6) for k in range(1, depth + 1)]
    assert prefetcher.hits == 11 and prefetcher.misses == 7  # the first forward learns
    disable_prefetch(offloaded)


def test_discard_releases_what_was_fetched_and_keeps_the_order(tmp_path: Path) -> None:
    model, x = stack()
    expected = forward(model, x)
    offloaded = disk_offload(copy.deepcopy(model), tmp_path, "cpu", prefetch=True)
    prefetcher = offloaded._wb_prefetcher
    forward(offloaded, x)
    forward(offloaded, x)
    jobs = list(prefetcher._reads.values())
    assert len(jobs) == 2 and all(job.wait() for job in jobs)  # modules 0 and 1, fetched
    prefetcher.discard()
    assert not prefetcher._reads and all(job.tensors is None for job in jobs)
    hits, misses = prefetcher.hits, prefetcher.misses
    torch.testing.assert_close(forward(offloaded, x), expected, rtol=0, atol=0)
    assert (prefetcher.hits - hits, prefetcher.misses - misses) == (5, 1)
    disable_prefetch(offloaded)


def test_cancelled_job_reads_nothing(tmp_path: Path) -> None:
    model, _ = stack(layers=1)
    offloaded = disk_offload(copy.deepcopy(model), tmp_path, "cpu")
    job = MapJob(list(offloaded[0]._hf_hook.slots))
    job.cancel()
    job.run()
    assert job.done.is_set() and job.wait() is None


def test_a_failed_prefetch_surfaces_as_the_forwards_own_error(tmp_path: Path) -> None:
    model, x = stack()
    expected = forward(model, x)
    offloaded = disk_offload(copy.deepcopy(model), tmp_path, "cpu", prefetch=True)
    forward(offloaded, x)
    forward(offloaded, x)
    (tmp_path / "3.weight.dat").unlink()
    with pytest.raises(CheckpointError, match=r"3\.weight\.dat.*missing"):
        forward(offloaded, x)
    assert all(hook._depth == 0 for hook in offloaded._wb_prefetcher.hooks)
    model[3].weight.detach().numpy().tofile(tmp_path / "3.weight.dat")
    torch.testing.assert_close(forward(offloaded, x), expected, rtol=0, atol=0)
    disable_prefetch(offloaded)


def test_safetensors_entries_and_cast_weights_are_prefetched(tmp_path: Path) -> None:
    model, x = stack(layers=4)
    halves = {f"{i}.weight": model[i].weight.detach().half() for i in range(4)}
    save_file(halves, str(tmp_path / "model.safetensors"))
    index = {
        name: {
            "dtype": "float16",
            "shape": list(tensor.shape),
            "safetensors_file": str(tmp_path / "model.safetensors"),
            "weight_name": name,
        }
        for name, tensor in halves.items()
    }
    for i in range(4):  # biases as raw .dat files next to the pointers
        model[i].bias.detach().numpy().tofile(tmp_path / f"{i}.bias.dat")
        index[f"{i}.bias"] = {"dtype": "float32", "shape": [8]}
    (tmp_path / "index.json").write_text(json.dumps(index))
    reference = copy.deepcopy(model)
    for i in range(4):
        reference[i].weight.data = halves[f"{i}.weight"].float()
    expected = forward(reference, x)
    with torch.device("meta"):
        empty = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)]).eval()
    offloaded = disk_offload(empty, tmp_path, "cpu", prefetch=True)
    for _ in range(3):
        torch.testing.assert_close(forward(offloaded, x), expected, rtol=0, atol=0)
    assert offloaded._wb_prefetcher.hits == 7
    disable_prefetch(offloaded)


def _rss_kib(tensor: torch.Tensor) -> int:
    """Resident KiB of the mapping that holds ``tensor`` (from /proc/self/smaps)."""
    address = tensor.data_ptr()
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if match and int(match[1], 16) <= address < int(match[2], 16):
            rss = next(entry for entry in lines[i + 1 :] if entry.startswith("Rss:"))
            return int(rss.split()[1])
    raise AssertionError("mapping not found")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
@pytest.mark.parametrize("with_madvise", [True, False])
def test_populate_maps_every_page(tmp_path: Path, monkeypatch, with_madvise: bool) -> None:
    if not with_madvise:
        monkeypatch.setattr(prefetch_reader, "_madvise", None)  # the page-touching fallback
    path = tmp_path / "w.dat"
    torch.arange(1 << 18, dtype=torch.float32).numpy().tofile(path)  # 1 MiB
    mapped = torch.from_file(str(path), shared=False, size=1 << 18, dtype=torch.float32)
    assert _rss_kib(mapped) == 0
    populate(mapped)
    assert _rss_kib(mapped) == 1024
    assert torch.equal(mapped, torch.arange(1 << 18, dtype=torch.float32))
    populate(torch.empty(0))  # nothing to do


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore and fadvise")
def test_is_cached_follows_the_page_cache(tmp_path: Path) -> None:
    path = tmp_path / "w.dat"
    torch.ones(1 << 18).numpy().tofile(path)  # 1 MiB, just written: cached
    mapped = torch.from_file(str(path), shared=False, size=1 << 18, dtype=torch.float32)
    assert is_cached(mapped) and is_cached(torch.ones(3)) and is_cached(torch.empty(0))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if is_cached(mapped):
        pytest.skip(f"{tmp_path} keeps pages cached after DONTNEED (tmpfs?)")
    populate(mapped)
    assert is_cached(mapped)


def test_bad_depth() -> None:
    with pytest.raises(ValueError, match="depth"):
        Prefetcher([], depth=0)
