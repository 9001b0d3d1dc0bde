"""``save_sharded_checkpoint`` reports each shard as it lands on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from workbench.big_modeling.loading.writer import INDEX_NAME, ShardProgress, save_sharded_checkpoint

KIB = 1024


def _state(count: int) -> dict[str, torch.Tensor]:
    """``count`` float32 tensors of 256 values (1 KiB each), seeded."""
    generator = torch.Generator().manual_seed(0)
    return {f"t{k}": torch.randn(256, generator=generator) for k in range(count)}


def _shard_name(k: int, n: int) -> str:
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def test_four_shards_report_before_the_first_and_after_each_file(tmp_path: Path) -> None:
    state = _state(8)  # 8 KiB cut into 4 shards of 2 tensors (2 KiB) each
    seen: list[tuple[ShardProgress, list[str]]] = []

    def on_shard(report: ShardProgress) -> None:
        seen.append((report, sorted(p.name for p in tmp_path.glob("*.safetensors"))))

    index = save_sharded_checkpoint(state, tmp_path, num_shards=4, progress=on_shard)

    reports = [report for report, _ in seen]
    assert reports == [
        ShardProgress(0, 4, 0, 8 * KIB),
        ShardProgress(1, 4, 2 * KIB, 8 * KIB, _shard_name(1, 4)),
        ShardProgress(2, 4, 4 * KIB, 8 * KIB, _shard_name(2, 4)),
        ShardProgress(3, 4, 6 * KIB, 8 * KIB, _shard_name(3, 4)),
        ShardProgress(4, 4, 8 * KIB, 8 * KIB, _shard_name(4, 4)),
    ]
    # each report comes once its file is on disk under its real name, and before the next
    assert [files for _, files in seen] == [
        [_shard_name(j, 4) for j in range(1, k + 1)] for k in range(5)
    ]
    assert [report.describe() for report in reports] == [
        "writing shard 1 of 4",
        "writing shard 2 of 4",
        "writing shard 3 of 4",
        "writing shard 4 of 4",
        "wrote 4 shards",
    ]
    assert [report.fraction for report in reports] == [0.0, 0.25, 0.5, 0.75, 1.0]
    weight_map = json.loads(index.read_text())["weight_map"]
    assert weight_map["t0"] == _shard_name(1, 4) and weight_map["t7"] == _shard_name(4, 4)


def test_one_file_reports_once_before_and_once_after(tmp_path: Path) -> None:
    reports: list[ShardProgress] = []
    path = save_sharded_checkpoint(_state(3), tmp_path, progress=reports.append)
    assert path == tmp_path / "model.safetensors"
    assert reports == [
        ShardProgress(0, 1, 0, 3 * KIB),
        ShardProgress(1, 1, 3 * KIB, 3 * KIB, "model.safetensors"),
    ]
    assert reports[-1].describe() == "wrote 1 shard"


def test_reports_count_the_files_written_not_the_files_asked_for(tmp_path: Path) -> None:
    reports: list[ShardProgress] = []
    save_sharded_checkpoint(_state(2), tmp_path, num_shards=5, progress=reports.append)
    assert [(r.shards_done, r.num_shards) for r in reports] == [(0, 2), (1, 2), (2, 2)]
    assert len(list(tmp_path.glob("*.safetensors"))) == 2
    assert (tmp_path / INDEX_NAME).is_file()


def test_without_a_callback_tied_and_strided_tensors_round_trip(tmp_path: Path) -> None:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = {"a": base, "tied": base, "strided": base.t(), "b": torch.ones(2, dtype=torch.int64)}
    save_sharded_checkpoint(state, tmp_path, num_shards=2)
    weight_map = json.loads((tmp_path / INDEX_NAME).read_text())["weight_map"]
    loaded: dict[str, torch.Tensor] = {}
    for file_name in sorted(set(weight_map.values())):
        loaded.update(load_file(tmp_path / file_name))
    assert loaded.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor), name


def test_zero_shards_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_shards must be >= 1, got 0"):
        save_sharded_checkpoint(_state(1), tmp_path, num_shards=0)
