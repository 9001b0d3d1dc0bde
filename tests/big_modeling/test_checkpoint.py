"""CheckpointIndex: header-only indexing of every accepted checkpoint layout; streaming reads."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import checkpoint_fixtures as fx
import psutil
import pytest
import torch
from checkpoint_fixtures import (
    TinyNet,
    state_without_tie_copy,
    write_safetensors_raw,
)
from safetensors.torch import save_file

from workbench.big_modeling import CheckpointIndex
from workbench.big_modeling.errors import CheckpointError
from workbench.big_modeling.loading.reader import iter_checkpoint_tensors

# TinyNet state without head.weight: embed 16*8, per block up 16*8+16, bn 4*16 (+int64 counter),
# down 8*16+8; norm 8+8; position_ids 4 int64.
FLOAT_NUMEL = 128 + 3 * (128 + 16 + 64 + 128 + 8) + 16
EXPECTED_NBYTES = FLOAT_NUMEL * 4 + 3 * 8 + 4 * 8  # = 4760

# session fixtures shared with the other loading tests
reference_model = fx.reference_model
sharded_ckpt = fx.sharded_ckpt
single_ckpt = fx.single_ckpt


def test_sharded_folder_index_matches_state_dict(
    sharded_ckpt: Path, reference_model: TinyNet
) -> None:
    index = CheckpointIndex.from_path(sharded_ckpt)
    state = state_without_tie_copy(reference_model)
    assert set(index.tensors) == set(state)
    for name, tensor in state.items():
        info = index.tensors[name]
        assert (info.dtype, info.shape, info.nbytes) == (
            tensor.dtype,
            tuple(tensor.shape),
            tensor.numel() * tensor.element_size(),
        )
    assert index.total_nbytes == EXPECTED_NBYTES == 4760
    assert len(index.files) == 3
    assert index.index_file == sharded_ckpt / "model.safetensors.index.json"
    assert index.dtype_counts() == {torch.float32: len(state) - 4, torch.int64: 4}
    assert index.dtype_nbytes()[torch.int64] == 56
    assert sum(len(v) for v in index.by_file().values()) == len(state)


def test_index_json_path_and_single_file_agree(sharded_ckpt: Path, single_ckpt: Path) -> None:
    via_json = CheckpointIndex.from_path(sharded_ckpt / "model.safetensors.index.json")
    single = CheckpointIndex.from_path(single_ckpt / "model.safetensors")
    folder = CheckpointIndex.from_path(single_ckpt)
    assert via_json.total_nbytes == single.total_nbytes == folder.total_nbytes
    assert {n: (i.dtype, i.shape) for n, i in via_json.tensors.items()} == {
        n: (i.dtype, i.shape) for n, i in single.tensors.items()
    }
    assert folder.files == (single_ckpt / "model.safetensors",)


def test_bin_file_and_folder(tmp_path: Path, reference_model: TinyNet) -> None:
    state = state_without_tie_copy(reference_model)
    torch.save(state, tmp_path / "pytorch_model.bin")
    for path in (tmp_path, tmp_path / "pytorch_model.bin"):
        index = CheckpointIndex.from_path(path)
        assert index.total_nbytes == EXPECTED_NBYTES
        assert not index.tensors["embed.weight"].is_safetensors
        with pytest.raises(CheckpointError, match="is pickled, it has no byte offset"):
            _ = index.tensors["embed.weight"].file_offset


def test_legacy_pickle_format_loads(tmp_path: Path, reference_model: TinyNet) -> None:
    state = state_without_tie_copy(reference_model)
    torch.save(
        state, tmp_path / "old.pt", _use_new_zipfile_serialization=False
    )  # not memory-mappable
    got = dict(iter_checkpoint_tensors(tmp_path / "old.pt"))
    assert all(torch.equal(got[name], tensor) for name, tensor in state.items())


def test_folder_prefers_single_safetensors(tmp_path: Path, single_ckpt: Path) -> None:
    shutil.copy(single_ckpt / "model.safetensors", tmp_path / "model.safetensors")
    torch.save({"other": torch.ones(1)}, tmp_path / "pytorch_model.bin")
    assert "other" not in CheckpointIndex.from_path(tmp_path)


def test_offsets_are_absolute_positions(single_ckpt: Path, reference_model: TinyNet) -> None:
    index = CheckpointIndex.from_path(single_ckpt)
    info = index.tensors["norm.weight"]
    with open(info.file, "rb") as handle:
        handle.seek(info.file_offset)
        raw = handle.read(info.nbytes)
    assert torch.equal(
        torch.frombuffer(bytearray(raw), dtype=torch.float32), reference_model.norm.weight.detach()
    )


def test_header_only_on_a_huge_sparse_file(tmp_path: Path) -> None:
    """A 64 GiB tensor is indexed in milliseconds without memory growth: no data is read."""
    nbytes = 64 * 2**30  # 2**34 fp32 elements = 64 GiB
    path = write_safetensors_raw(
        tmp_path / "huge.safetensors",
        {"big": {"dtype": "F32", "shape": [2**17, 2**17], "data_offsets": [0, nbytes]}},
        b"",
    )
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size + nbytes)  # sparse: no blocks on disk
    rss_before = psutil.Process().memory_info().rss
    start = time.perf_counter()
    index = CheckpointIndex.from_path(path)
    assert time.perf_counter() - start < 2.0
    assert index.total_nbytes == nbytes
    assert psutil.Process().memory_info().rss - rss_before < 64 * 2**20


def test_metadata_and_dtypes_round_trip(tmp_path: Path) -> None:
    tensors = {
        "bf": torch.randn(3, 2).to(torch.bfloat16),
        "f8": torch.randn(4).to(torch.float8_e4m3fn),
        "flag": torch.tensor([True, False]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 5),
        "u8": torch.arange(5, dtype=torch.uint8),
    }
    save_file(tensors, tmp_path / "m.safetensors", metadata={"format": "pt", "note": "x"})
    index = CheckpointIndex.from_path(tmp_path / "m.safetensors")
    assert index.metadata[tmp_path / "m.safetensors"] == {"format": "pt", "note": "x"}
    got = dict(iter_checkpoint_tensors(index))
    for name, tensor in tensors.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape
        assert torch.equal(
            got[name].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)
        )  # bit-exact


def test_iter_tensors_streams_in_file_order_and_casts_floats_only(
    sharded_ckpt: Path, reference_model: TinyNet
) -> None:
    state = state_without_tie_copy(reference_model)
    index = CheckpointIndex.from_path(sharded_ckpt)
    names = []
    for name, tensor in iter_checkpoint_tensors(sharded_ckpt, dtype=torch.float16):
        names.append(name)
        expected = state[name].to(torch.float16) if state[name].is_floating_point() else state[name]
        assert tensor.dtype == expected.dtype and torch.equal(tensor, expected)
    assert names == list(index.tensors)
    subset = dict(iter_checkpoint_tensors(index, ["norm.bias"]))
    assert list(subset) == ["norm.bias"]
    with pytest.raises(CheckpointError, match="no tensors named nope"):
        list(iter_checkpoint_tensors(index, ["nope"]))


def test_file_truncated_after_indexing(tmp_path: Path) -> None:
    save_file({"a": torch.ones(1000)}, tmp_path / "m.safetensors")
    index = CheckpointIndex.from_path(tmp_path / "m.safetensors")
    os.truncate(tmp_path / "m.safetensors", 500)
    with pytest.raises(CheckpointError, match=r"m\.safetensors: ended while reading tensor 'a'"):
        list(iter_checkpoint_tensors(index))


def test_weight_map_may_be_flat(tmp_path: Path, single_ckpt: Path) -> None:
    shutil.copy(single_ckpt / "model.safetensors", tmp_path / "a.safetensors")
    names = list(CheckpointIndex.from_path(single_ckpt).tensors)
    (tmp_path / "flat.index.json").write_text(json.dumps(dict.fromkeys(names, "a.safetensors")))
    assert set(CheckpointIndex.from_path(tmp_path).tensors) == set(names)
