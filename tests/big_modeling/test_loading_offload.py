"""Disk tier (zero copy), progress, cancel, and load_checkpoint_and_dispatch."""

from __future__ import annotations

import json
from pathlib import Path

import checkpoint_fixtures as fx
import pytest
import torch
from checkpoint_fixtures import (
    TinyNet,
    empty_model,
)

from workbench.big_modeling import (
    CancelToken,
    LoadCancelled,
    LoadProgress,
    OffloadedWeightsLoader,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
)
from workbench.big_modeling.loading import execute, reader

# session fixtures shared with the other loading tests
reference_model = fx.reference_model
sharded_ckpt = fx.sharded_ckpt
fp16_ckpt = fx.fp16_ckpt


IDS = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 15]])
# Module keys only (no overlapping "" entry); root buffers named directly.
DISK_MAP = {
    "embed": "cpu",
    "blocks.0": "cpu",
    "blocks.1": "disk",
    "blocks.2": "disk",
    "norm": "cpu",
    "head": "cpu",
    "position_ids": "cpu",
    "scratch": "cpu",
}


def test_disk_tier_is_zero_copy_when_dtype_kept(
    sharded_ckpt: Path, reference_model: TinyNet, tmp_path: Path
) -> None:
    folder = tmp_path / "off"
    model = empty_model()
    result = load_checkpoint_in_model(
        model, sharded_ckpt, device_map=DISK_MAP, offload_folder=folder
    )
    assert result.offload_nbytes_written == 0
    assert sorted(p.name for p in folder.iterdir()) == ["index.json"]
    index = json.loads((folder / "index.json").read_text())
    entry = index["blocks.1.up.weight"]
    assert (
        entry["weight_name"] == "blocks.1.up.weight"
        and entry["shape"] == [16, 8]
        and entry["dtype"] == "float32"
    )
    assert (
        Path(entry["safetensors_file"]).is_absolute()
        and Path(entry["safetensors_file"]).parent == sharded_ckpt
    )
    assert model.blocks[1].up.weight.device.type == "meta"
    # persistent buffers of disk modules load to CPU (offload_buffers=False)
    assert torch.equal(model.blocks[1].bn.running_mean, reference_model.blocks[1].bn.running_mean)
    assert "blocks.1.bn.running_mean" not in index
    weights = OffloadedWeightsLoader(save_folder=folder)
    for name in index:
        assert torch.equal(weights[name], reference_model.state_dict()[name]), name


def test_disk_tier_writes_only_cast_weights(
    sharded_ckpt: Path, reference_model: TinyNet, tmp_path: Path
) -> None:
    folder = tmp_path / "off"
    model = empty_model()
    result = load_checkpoint_in_model(
        model,
        sharded_ckpt,
        device_map=DISK_MAP,
        offload_folder=folder,
        dtype=torch.float16,
        keep_in_fp32_modules=["blocks.2.bn"],
    )
    index = json.loads((folder / "index.json").read_text())
    # blocks.1 and blocks.2 weights cast to fp16: 2 * (16*8 + 16 + 2*16 + 8*16 + 8) = 2 * 312 elements
    # minus blocks.2.bn (kept fp32, a zero-copy pointer): 2*16 elements -> (624 - 32) * 2 B
    assert result.offload_nbytes_written == (624 - 32) * 2
    assert "safetensors_file" in index["blocks.2.bn.weight"]
    assert index["blocks.1.up.weight"] == {
        "dtype": "float16",
        "shape": [16, 8],
        "generation": index["blocks.1.down.weight"]["generation"],  # one commit wrote both
    }
    weights = OffloadedWeightsLoader(save_folder=folder)
    assert torch.equal(
        weights["blocks.1.up.weight"], reference_model.blocks[1].up.weight.to(torch.float16)
    )
    assert model.blocks[1].up.weight.dtype == torch.float16


def test_a_tied_weight_cast_to_disk_takes_its_bytes_once(
    sharded_ckpt: Path, reference_model: TinyNet, tmp_path: Path
) -> None:
    """The embedding and the head share one tensor: each name keeps its own ``.dat`` file (the
    folder format), hard links of one file, written once (it was written twice: SmolLM2-135M's
    tied embedding took 113 MiB a name in float32)."""
    import os

    from workbench.big_modeling.offload.folder import raw_weight_path

    folder = tmp_path / "off"
    tied_on_disk = {**DISK_MAP, "embed": "disk", "head": "disk"}
    result = load_checkpoint_in_model(
        empty_model(), sharded_ckpt, device_map=tied_on_disk, offload_folder=folder,
        dtype=torch.float16,
    )  # fmt: skip
    embed, head = (raw_weight_path(folder, name).stat() for name in ("embed.weight", "head.weight"))
    assert (embed.st_dev, embed.st_ino) == (head.st_dev, head.st_ino) and embed.st_nlink == 2
    # 16 x 8 float16 once, plus blocks.1 and blocks.2 (624 elements, as in the test above)
    assert result.offload_nbytes_written == (16 * 8 + 624) * 2
    weights = OffloadedWeightsLoader(save_folder=folder)
    expected = reference_model.embed.weight.to(torch.float16)
    assert torch.equal(weights["embed.weight"], expected)
    assert torch.equal(weights["head.weight"], expected)
    assert not [name for name in os.listdir(folder) if name.endswith(".tmp")]


def test_buffers_offloaded_with_offload_buffers(
    sharded_ckpt: Path, reference_model: TinyNet, tmp_path: Path
) -> None:
    folder = tmp_path / "off"
    model = empty_model()
    load_checkpoint_in_model(
        model, sharded_ckpt, device_map=DISK_MAP, offload_folder=folder, offload_buffers=True
    )
    weights = OffloadedWeightsLoader(save_folder=folder)
    for stat in ("running_mean", "running_var", "num_batches_tracked"):
        name = f"blocks.2.bn.{stat}"
        assert torch.equal(weights[name], reference_model.state_dict()[name]), name
    assert model.blocks[2].bn.running_var.device.type == "meta"


@pytest.mark.parametrize("device_map", [None, DISK_MAP])
def test_dispatch_runs_like_the_reference(
    device_map: dict | None, sharded_ckpt: Path, reference_model: TinyNet, tmp_path: Path
) -> None:
    model = load_checkpoint_and_dispatch(
        empty_model(), sharded_ckpt, device_map=device_map, offload_folder=tmp_path / "off"
    )
    torch.testing.assert_close(model.eval()(IDS), reference_model(IDS), rtol=0, atol=0)


@pytest.mark.parametrize("strategy", ["auto", "balanced", "balanced_low_0", "sequential"])
def test_dispatch_auto_map_with_budget(
    strategy: str, fp16_ckpt: tuple[TinyNet, Path], tmp_path: Path
) -> None:
    reference, folder = fp16_ckpt
    # fp16 TinyNet: 2380 B; a 1200 B CPU budget forces some blocks to disk
    model = load_checkpoint_and_dispatch(
        empty_model(torch.float16),
        folder,
        device_map=strategy,
        max_memory={"cpu": 1200},
        no_split_module_classes=["Block"],
        offload_folder=tmp_path / "off",
    )
    assert "disk" in model.hf_device_map.values() and "cpu" in model.hf_device_map.values()
    assert (tmp_path / "off" / "index.json").is_file()
    assert sorted(p.suffix for p in (tmp_path / "off").iterdir()) == [".json"]  # zero copy
    torch.testing.assert_close(model.eval()(IDS).float(), reference(IDS).float(), rtol=0, atol=0)


def test_progress_reports_bytes_and_names(
    sharded_ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "READ_CHUNK_NBYTES", 64)  # 512 B embed.weight -> 8 chunk reports
    reports: list[LoadProgress] = []
    load_checkpoint_in_model(empty_model(), sharded_ckpt, progress=reports.append, mmap=False)
    assert reports[0].bytes_done == 0 and reports[-1].bytes_done == reports[-1].bytes_total == 4760
    done = [r.bytes_done for r in reports]
    assert done == sorted(done)
    embed = [r for r in reports if r.tensor_name == "embed.weight"]
    assert len(embed) >= 8
    assert {r.phase for r in reports} == {"loading"}


def test_cancel_leaves_untouched_on_meta_and_no_files(sharded_ckpt: Path, tmp_path: Path) -> None:
    folder = tmp_path / "off"
    folder.mkdir()
    (folder / "index.json").write_text(json.dumps({"old": {"dtype": "float32", "shape": [1]}}))
    (folder / "old.dat").write_bytes(b"\0\0\0\0")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    token = CancelToken()
    staged: list[str] = []

    def progress(report: LoadProgress) -> None:
        staged.extend(p.name for p in folder.glob("*.tmp"))
        if len(staged) >= 3:  # cancel once this load has staged data files
            token.cancel()

    model = empty_model()
    with pytest.raises(LoadCancelled):
        load_checkpoint_in_model(
            model,
            sharded_ckpt,
            device_map={"": "disk", "embed": "cpu", "head": "cpu", "blocks.0": "cpu"},
            offload_folder=folder,
            dtype=torch.float16,
            progress=progress,
            cancel=token,
        )
    assert len(staged) >= 3
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # nothing staged is left
    loaded = {n for n, p in model.named_parameters() if p.device.type == "cpu"}
    assert loaded and loaded < {n for n, _ in model.named_parameters()}
    assert all(p.device.type == "meta" for n, p in model.named_parameters() if n not in loaded)


def test_cancel_before_start_changes_nothing(sharded_ckpt: Path) -> None:
    token = CancelToken()
    token.cancel()
    model = empty_model()
    with pytest.raises(LoadCancelled):
        load_checkpoint_in_model(model, sharded_ckpt, cancel=token)
    assert all(p.device.type == "meta" for p in model.parameters())


@pytest.mark.parametrize("where", ["cpu", "disk"])
def test_large_cast_reports_every_chunk(
    where: str,
    sharded_ckpt: Path,
    reference_model: TinyNet,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # blocks.0.up.weight: 16*8 fp32 = 512 B, read + cast (+ written) in 8 chunks of 64 B
    monkeypatch.setattr(execute, "WORK_CHUNK_NBYTES", 64)
    reports: list[LoadProgress] = []
    model = empty_model()
    load_checkpoint_in_model(
        model,
        sharded_ckpt,
        device_map={"": "cpu", "blocks.0.up": where},
        offload_folder=tmp_path / "off",
        dtype=torch.float16,
        progress=reports.append,
    )
    chunks = [r.bytes_done for r in reports if r.tensor_name == "blocks.0.up.weight"]
    assert len(chunks) >= 8
    assert chunks == sorted(chunks) and chunks[-1] - chunks[0] == 512 - 64
    expected = reference_model.blocks[0].up.weight.to(torch.float16)
    if where == "cpu":
        assert torch.equal(model.blocks[0].up.weight, expected)
    else:
        assert torch.equal(
            OffloadedWeightsLoader(save_folder=tmp_path / "off")["blocks.0.up.weight"], expected
        )


@pytest.mark.parametrize("where", ["cpu", "disk"])
def test_cancel_mid_tensor_stops_before_it_finishes(
    where: str, sharded_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(execute, "WORK_CHUNK_NBYTES", 64)  # blocks.0.up.weight: 8 chunks
    folder = tmp_path / "off"
    folder.mkdir()
    (folder / "keep.txt").write_text("user file")
    token = CancelToken()
    seen: list[int] = []

    def progress(report: LoadProgress) -> None:
        if report.tensor_name == "blocks.0.up.weight":
            seen.append(report.bytes_done)
            if len(seen) == 3:
                token.cancel()

    model = empty_model()
    with pytest.raises(LoadCancelled):
        load_checkpoint_in_model(
            model,
            sharded_ckpt,
            device_map={"": "disk", "blocks.0.up": where},
            offload_folder=folder,
            dtype=torch.float16,
            progress=progress,
            cancel=token,
        )
    assert len(seen) == 3  # stopped after the third of eight chunks
    assert model.blocks[0].up.weight.device.type == "meta"
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]  # no partial .tmp or .dat
