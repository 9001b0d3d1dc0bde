"""Hostile checkpoints, offload folders and sizes: each a named error, never a traceback."""

from __future__ import annotations

import json
import shutil
import struct
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from workbench.big_modeling.errors import BadInputError, CheckpointError, MemoryBudgetError
from workbench.big_modeling.hooks.prefetch_reader import _safetensors_offsets
from workbench.big_modeling.loading.index import CheckpointIndex
from workbench.big_modeling.offload.folder import load_offload_index, offload_state_dict
from workbench.big_modeling.planning import sizes
from workbench.big_modeling.planning.sizes import (
    SizeUnitWarning,
    convert_file_size_to_int,
    get_max_memory,
)


def _sharded(folder: Path) -> Path:
    folder.mkdir(parents=True)
    save_file({"a": torch.zeros(2)}, str(folder / "s1.safetensors"))
    save_file({"b": torch.ones(2)}, str(folder / "s2.safetensors"))
    index = {"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def test_a_shard_linking_outside_the_folder_is_refused(tmp_path: Path) -> None:
    folder = _sharded(tmp_path / "ckpt")
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(folder / "s2.safetensors", outside)
    (folder / "s2.safetensors").symlink_to(outside)
    with pytest.raises(CheckpointError, match=r"1 shard\(s\) are links that lead outside .*ckpt"):
        CheckpointIndex.from_path(folder)


def test_a_link_inside_the_folder_is_fine(tmp_path: Path) -> None:
    folder = _sharded(tmp_path / "ckpt")
    (folder / "sub").mkdir()
    shutil.move(folder / "s2.safetensors", folder / "sub" / "real.safetensors")
    (folder / "s2.safetensors").symlink_to(folder / "sub" / "real.safetensors")
    assert sorted(CheckpointIndex.from_path(folder).tensors) == ["a", "b"]


def test_the_hugging_face_cache_layout_links_into_blobs(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = _sharded(repo / "snapshots" / "abc123")
    (repo / "blobs").mkdir()
    for name in ("s1.safetensors", "s2.safetensors"):
        blob = repo / "blobs" / f"sha-{name}"
        shutil.move(snapshot / name, blob)
        (snapshot / name).symlink_to(Path("../../blobs") / blob.name)  # as huggingface_hub does
    assert sorted(CheckpointIndex.from_path(snapshot).tensors) == ["a", "b"]
    outside = tmp_path / "evil.safetensors"
    shutil.copy(repo / "blobs" / "sha-s2.safetensors", outside)
    (snapshot / "s2.safetensors").unlink()
    (snapshot / "s2.safetensors").symlink_to(outside)  # out of the cache repo: refused
    with pytest.raises(CheckpointError, match=r"links that lead outside .*models--org--tiny"):
        CheckpointIndex.from_path(snapshot)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested more than 64"),
        ('{"weight_map": {"a": "s1.safetensors"}, "n": ' + "9" * 5000 + "}", "not usable JSON"),
    ],
    ids=["deep", "long-int"],
)
def test_hostile_index_json(tmp_path: Path, text: str, problem: str) -> None:
    folder = _sharded(tmp_path / "ckpt")
    (folder / "model.safetensors.index.json").write_text(text)
    with pytest.raises(CheckpointError, match=problem):
        CheckpointIndex.from_path(folder)


def test_a_deep_safetensors_header_is_a_named_error(tmp_path: Path) -> None:
    raw = b'{"w": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(CheckpointError, match=r"x\.safetensors header: nested more than 8"):
        CheckpointIndex.from_path(path)


def test_the_prefetch_reader_uses_the_capped_header_reader(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 200 * 2**20) + b"{}")  # declares a 200 MiB header
    with pytest.raises(CheckpointError, match="above the 104857600-byte limit"):
        _safetensors_offsets(str(path), {})
    good = tmp_path / "good.safetensors"
    save_file({"w": torch.arange(4, dtype=torch.float32)}, str(good))
    (offset, nbytes) = _safetensors_offsets(str(good), {})["w"]
    assert nbytes == 16 and good.read_bytes()[offset : offset + 16] == bytes(
        torch.arange(4, dtype=torch.float32).numpy()
    )


def test_an_offload_index_with_a_huge_integer_is_named(tmp_path: Path) -> None:
    offload_state_dict(tmp_path, {"w": torch.ones(2)})
    (tmp_path / "index.json").write_text(
        '{"w": {"dtype": "float32", "shape": [' + "2" * 5000 + "]}}"
    )
    with pytest.raises(CheckpointError, match=r"index\.json: not usable JSON"):
        load_offload_index(tmp_path)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("9" * 400 + "GB", "above the limit of 1 EiB"),
        (1e400, "above the limit of 1 EiB"),
        (float("nan"), r"not a number \(NaN\)"),
        (10**400, "above the limit of 1 EiB"),
        (-(10**400), "negative"),
        ("\u0661GB", "not a number with a known unit"),  # was read as 1 GB
        ("2\u00b2GiB", "not a number with a known unit"),
    ],
    ids=["400-digits", "1e400", "nan", "int-10e400", "int-minus", "arabic-one", "superscript"],
)
def test_sizes_are_finite_non_negative_and_named(value: object, problem: str) -> None:
    with pytest.raises(BadInputError, match=problem):
        convert_file_size_to_int(value)  # type: ignore[arg-type]
    with pytest.raises(MemoryBudgetError, match=f"'cpu': .*{problem}"):
        get_max_memory({"cpu": value})  # type: ignore[dict-item]


def test_lower_case_b_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizes, "_warned_lower_b", False)
    with pytest.warns(SizeUnitWarning, match="'10gb' is read as GB .* bits, 8 times less"):
        assert convert_file_size_to_int("10gb") == 10 * 10**9  # ours: bytes, as "10GB"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert convert_file_size_to_int("3mb") == 3 * 10**6  # once only
        assert convert_file_size_to_int("3MB") == 3 * 10**6
        assert convert_file_size_to_int("3gib") == 3 * 2**30  # binary units mean bytes there too
