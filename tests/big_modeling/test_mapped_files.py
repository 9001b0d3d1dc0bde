"""Raw offload files stay mapped between accesses, within a byte budget, and never go stale."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from workbench.big_modeling.errors import CheckpointError
from workbench.big_modeling.offload.folder import (
    OffloadedWeightsLoader,
    load_offloaded_weight,
    offload_state_dict,
    raw_weight_path,
)
from workbench.big_modeling.offload.mapped_files import MappedFileCache


def _offloaded(tmp_path: Path, count: int = 3, numel: int = 1024) -> dict[str, torch.Tensor]:
    weights = {f"w{i}": torch.full((numel,), float(i)) for i in range(count)}
    offload_state_dict(tmp_path, weights)
    return weights


def test_a_second_access_reuses_the_open_map(tmp_path: Path) -> None:
    _offloaded(tmp_path)
    loader = OffloadedWeightsLoader(save_folder=tmp_path)
    first, second = loader["w1"], loader["w1"]
    assert first.data_ptr() == second.data_ptr()
    assert loader.mapped_files.open_bytes == 1024 * 4
    torch.testing.assert_close(second, torch.full((1024,), 1.0), rtol=0, atol=0)


def test_a_zero_budget_maps_the_file_anew_each_time(tmp_path: Path) -> None:
    _offloaded(tmp_path)
    loader = OffloadedWeightsLoader(save_folder=tmp_path, map_cache_bytes=0)
    first, second = loader["w1"], loader["w1"]
    assert first.data_ptr() != second.data_ptr()
    assert len(loader.mapped_files) == 0


def test_the_budget_closes_the_least_recently_used_maps(tmp_path: Path) -> None:
    _offloaded(tmp_path, count=3)
    cache = MappedFileCache(budget_bytes=2 * 4096)
    opened: list[str] = []

    def open_map(path: Path) -> torch.Tensor:
        opened.append(path.stem)
        return load_offloaded_weight(path, {"dtype": "float32", "shape": [1024]})

    for key in ("w0", "w1", "w0", "w2"):  # w1 is the least recently used when w2 arrives
        cache.get(raw_weight_path(tmp_path, key), open_map)
    assert cache.open_bytes == 2 * 4096 and len(cache) == 2
    cache.get(raw_weight_path(tmp_path, "w0"), open_map)
    cache.get(raw_weight_path(tmp_path, "w2"), open_map)
    assert opened == ["w0", "w1", "w2"]
    cache.get(raw_weight_path(tmp_path, "w1"), open_map)
    assert opened == ["w0", "w1", "w2", "w1"]


def test_a_file_rewritten_since_it_was_mapped_is_mapped_again(tmp_path: Path) -> None:
    _offloaded(tmp_path)
    loader = OffloadedWeightsLoader(save_folder=tmp_path)
    old = loader["w2"].clone()
    offload_state_dict(tmp_path, {"w2": torch.full((1024,), 7.0)})  # replaced by rename
    torch.testing.assert_close(old, torch.full((1024,), 2.0), rtol=0, atol=0)
    torch.testing.assert_close(loader["w2"], torch.full((1024,), 7.0), rtol=0, atol=0)


def test_a_file_truncated_after_mapping_is_reported(tmp_path: Path) -> None:
    _offloaded(tmp_path)
    loader = OffloadedWeightsLoader(save_folder=tmp_path)
    loader["w0"]
    path = raw_weight_path(tmp_path, "w0")
    os.truncate(path, 100)
    with pytest.raises(CheckpointError, match="truncated or stale"):
        loader["w0"]


def test_a_file_deleted_after_mapping_is_reported(tmp_path: Path) -> None:
    _offloaded(tmp_path)
    loader = OffloadedWeightsLoader(save_folder=tmp_path)
    loader["w0"]
    raw_weight_path(tmp_path, "w0").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        loader["w0"]


def test_a_file_larger_than_the_budget_is_served_but_not_held(tmp_path: Path) -> None:
    _offloaded(tmp_path, count=1, numel=4096)
    loader = OffloadedWeightsLoader(save_folder=tmp_path, map_cache_bytes=4096)
    torch.testing.assert_close(loader["w0"], torch.zeros(4096), rtol=0, atol=0)
    assert len(loader.mapped_files) == 0 and loader.mapped_files.open_bytes == 0


def test_the_count_limit_is_kept(tmp_path: Path) -> None:
    _offloaded(tmp_path, count=5, numel=16)
    cache = MappedFileCache(budget_bytes=1 << 20, max_files=3)
    loader = OffloadedWeightsLoader(save_folder=tmp_path)
    loader.mapped_files = cache
    for i in range(5):
        loader[f"w{i}"]
    assert len(cache) == 3 and cache.open_bytes == 3 * 64
    cache.clear()
    assert len(cache) == 0 and cache.open_bytes == 0


def test_the_default_budget_is_a_quarter_of_ram() -> None:
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert MappedFileCache().budget_bytes == physical // 4
