"""The offload folder format: lossless raw files, safetensors pointers, safety, atomicity."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from workbench.big_modeling import file_swap
from workbench.big_modeling.errors import CheckpointError, LoadCancelled, OffloadError
from workbench.big_modeling.offload.folder import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    disk_bytes_written,
    load_offload_index,
    load_offloaded_weight,
    offload_state_dict,
    offload_weight,
    remove_offloaded_files,
    save_offload_index,
)
from workbench.big_modeling.progress import CancelToken, LoadProgress


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor, so NaNs and fp8 compare bit for bit."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        values = torch.randn(shape, generator=generator, dtype=torch.float32) * 3
        return values.to(dtype)
    return torch.randint(-100 if dtype.is_signed else 0, 100, shape, generator=generator).to(dtype)


DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float64,
    torch.int64,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 5), (), (0, 4)], ids=["2d", "scalar", "empty"])
def test_round_trip_is_bit_exact_for_every_dtype(tmp_path: Path, dtype: torch.dtype, shape) -> None:
    weight = _sample(dtype, shape)
    index = offload_weight(weight, "h.0.weight", tmp_path)
    save_offload_index(index, tmp_path)

    entry = load_offload_index(tmp_path)["h.0.weight"]
    assert entry == {"dtype": str(dtype).removeprefix("torch."), "shape": list(shape)}
    # 3*5 elements * itemsize bytes, nothing else in the file
    assert (tmp_path / "h.0.weight.dat").stat().st_size == weight.numel() * dtype.itemsize
    loaded = load_offloaded_weight(tmp_path / "h.0.weight.dat", entry)
    assert loaded.dtype == dtype
    assert loaded.shape == weight.shape
    if weight.numel():
        assert torch.equal(_bits(loaded), _bits(weight))


def test_nan_and_inf_bits_survive(tmp_path: Path) -> None:
    weight = torch.tensor([float("nan"), float("inf"), -0.0, 1e-40], dtype=torch.bfloat16)
    offload_state_dict(tmp_path, {"w": weight})
    assert torch.equal(_bits(OffloadedWeightsLoader(save_folder=tmp_path)["w"]), _bits(weight))


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
def test_raw_weight_is_memory_mapped_and_copy_on_write(tmp_path: Path) -> None:
    weight = torch.arange(4096, dtype=torch.float32)
    offload_state_dict(tmp_path, {"big": weight})
    loaded = OffloadedWeightsLoader(save_folder=tmp_path)["big"]
    data_file = str(tmp_path / "big.dat")
    assert data_file in Path("/proc/self/maps").read_text()  # served by mmap, not read()

    loaded[0] = -1.0  # private mapping: the file must not change
    again = load_offloaded_weight(data_file, {"dtype": "float32", "shape": [4096]})
    assert again[0].item() == 0.0
    assert torch.equal(again, weight)


def test_offload_state_dict_merges_into_existing_index(tmp_path: Path) -> None:
    offload_state_dict(tmp_path, {"a": torch.ones(2, dtype=torch.float16)})
    written = offload_state_dict(tmp_path, {"b": torch.zeros(3, 1, dtype=torch.int32)})
    assert written == {"b": {"dtype": "int32", "shape": [3, 1]}}
    on_disk = json.loads((tmp_path / "index.json").read_text())
    generations = {name: entry.pop("generation") for name, entry in on_disk.items()}
    assert generations["a"] != generations["b"]  # each raw entry names the commit that wrote it
    assert on_disk == {
        "a": {"dtype": "float16", "shape": [2]},
        "b": {"dtype": "int32", "shape": [3, 1]},
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.dat", "b.dat", "index.json"]


def test_a_tied_tensor_is_written_once_under_each_of_its_names(tmp_path: Path) -> None:
    """Tied names (one tensor in the state dict twice) get hard links of one file: the folder
    format keeps a file per name, the disk holds the bytes once."""
    embed = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    before = disk_bytes_written()
    written = offload_state_dict(tmp_path, {"embed.weight": embed, "head.weight": embed})
    assert written["head.weight"] == {"dtype": "float32", "shape": [3, 4]}
    assert disk_bytes_written() - before == 48  # once
    first, second = ((tmp_path / f"{name}.weight.dat").stat() for name in ("embed", "head"))
    assert first.st_ino == second.st_ino and first.st_nlink == 2
    weights = OffloadedWeightsLoader(save_folder=tmp_path)
    assert torch.equal(weights["head.weight"], embed) and torch.equal(
        weights["embed.weight"], embed
    )
    # a view of other bytes of the same storage is another tensor
    offload_state_dict(tmp_path / "views", {"a": embed[0], "b": embed[1]})
    a, b = ((tmp_path / "views" / f"{name}.dat").stat() for name in "ab")
    assert a.st_ino != b.st_ino


def test_without_hard_links_a_tied_name_gets_a_copy(tmp_path: Path, monkeypatch) -> None:
    """A file system that makes no hard links (FAT, some network shares): the alias is copied,
    and its bytes count as written."""
    import os

    def no_links(*_args: object) -> None:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    embed = torch.arange(6, dtype=torch.float32)
    before = disk_bytes_written()
    offload_state_dict(tmp_path, {"embed.weight": embed, "head.weight": embed})
    assert disk_bytes_written() - before == 48  # written, then copied
    first, second = ((tmp_path / f"{name}.weight.dat").stat() for name in ("embed", "head"))
    assert first.st_ino != second.st_ino
    weights = OffloadedWeightsLoader(save_folder=tmp_path)
    assert torch.equal(weights["head.weight"], embed)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_progress_and_bytes_written_counter(tmp_path: Path) -> None:
    reports: list[LoadProgress] = []
    before = disk_bytes_written()
    state_dict = {"a": torch.ones(10), "b": torch.ones(6, dtype=torch.bfloat16)}
    offload_state_dict(tmp_path, state_dict, progress=reports.append)
    # 10*4 B + 6*2 B = 52 B
    assert disk_bytes_written() - before == 52
    assert [(r.bytes_done, r.bytes_total, r.tensor_name) for r in reports] == [
        (40, 52, "a"),
        (52, 52, "b"),
    ]


def test_cancel_leaves_folder_as_it_was(tmp_path: Path) -> None:
    offload_state_dict(tmp_path, {"old": torch.ones(2)})
    index_before = (tmp_path / "index.json").read_bytes()
    token = CancelToken()

    def cancel_after_first(report: LoadProgress) -> None:
        token.cancel()

    state_dict = {"old": torch.full((2,), 7.0), "new1": torch.ones(3), "new2": torch.ones(3)}
    with pytest.raises(LoadCancelled):
        offload_state_dict(tmp_path, state_dict, cancel=token, progress=cancel_after_first)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json", "old.dat"]
    assert (tmp_path / "index.json").read_bytes() == index_before
    assert torch.equal(OffloadedWeightsLoader(save_folder=tmp_path)["old"], torch.ones(2))


def test_write_failure_from_file_size_limit_leaves_no_partial_index(tmp_path: Path) -> None:
    """A real write error (RLIMIT_FSIZE -> EFBIG) in a child process; the old index survives."""
    offload_state_dict(tmp_path, {"old": torch.ones(4)})
    index_before = (tmp_path / "index.json").read_bytes()
    script = textwrap.dedent(
        f"""
        import resource, signal, sys, torch
        from workbench.big_modeling.errors import OffloadError
        from workbench.big_modeling.offload.folder import offload_state_dict
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        state = {{"small": torch.ones(8), "huge": torch.ones(100_000), "after": torch.ones(2)}}
        try:
            offload_state_dict({str(tmp_path)!r}, state)
        except OffloadError as exc:
            print("OFFLOAD_ERROR", exc.errno, exc)
            sys.exit(3)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 3, result.stderr
    assert "'huge'" in result.stdout and "offload folder" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json", "old.dat"]
    assert (tmp_path / "index.json").read_bytes() == index_before


def test_unusable_folder_raises_offload_error(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_bytes(b"")
    with pytest.raises(OffloadError, match="cannot write 'w'") as info:
        offload_weight(torch.ones(2), "w", not_a_folder)
    assert str(not_a_folder) in str(info.value)
    with pytest.raises(OffloadError, match="cannot create offload folder"):
        offload_state_dict(not_a_folder / "sub", {"w": torch.ones(2)})


@pytest.mark.parametrize("name", ["../evil", "sub/w", "/etc/passwd", "a\\b", ".."])
def test_index_names_cannot_escape_the_folder(tmp_path: Path, name: str) -> None:
    (tmp_path / "index.json").write_text(json.dumps({name: {"dtype": "float32", "shape": [1]}}))
    with pytest.raises(CheckpointError, match="not a plain file name") as info:
        load_offload_index(tmp_path)
    assert str(tmp_path / "index.json") in str(info.value)
    assert repr(name) in str(info.value)
    with pytest.raises(CheckpointError, match="not a plain file name"):
        offload_weight(torch.ones(1), name, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json"]


def test_symlink_out_of_folder_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.bin"
    secret.write_bytes(b"\x00" * 4)
    folder = tmp_path / "offload"
    folder.mkdir()
    (folder / "w.dat").symlink_to(secret)
    (folder / "index.json").write_text(json.dumps({"w": {"dtype": "float32", "shape": [1]}}))
    with pytest.raises(CheckpointError, match="outside the offload folder"):
        load_offload_index(folder)
    with pytest.raises(CheckpointError, match="outside the offload folder"):
        OffloadedWeightsLoader(save_folder=folder, index={"w": {"dtype": "float32", "shape": [1]}})[
            "w"
        ]


def test_symlink_inside_the_folder_is_allowed(tmp_path: Path) -> None:
    offload_state_dict(tmp_path, {"real": torch.arange(3.0)})
    (tmp_path / "alias.dat").symlink_to(tmp_path / "real.dat")
    save_offload_index({"alias": {"dtype": "float32", "shape": [3]}}, tmp_path)
    assert torch.equal(OffloadedWeightsLoader(save_folder=tmp_path)["alias"], torch.arange(3.0))


def test_loader_is_safe_to_read_from_several_threads(tmp_path: Path) -> None:
    """The prefetcher reads from a worker thread while the forward reads on the main one."""
    checkpoint = tmp_path / "model.safetensors"
    tensors = {f"t{i}": torch.full((64,), float(i)) for i in range(8)}
    save_file(tensors, str(checkpoint))
    folder = tmp_path / "offload"
    offload_state_dict(folder, {f"raw{i}": t for i, t in enumerate(tensors.values())})
    index = load_offload_index(folder)
    index.update(
        {
            name: {
                "dtype": "float32",
                "shape": [64],
                "safetensors_file": str(checkpoint),
                "weight_name": name,
            }
            for name in tensors
        }
    )
    loader = OffloadedWeightsLoader(save_folder=folder, index=index)

    def read_all(_: int) -> list[float]:
        return [loader[key].sum().item() for key in sorted(loader)]

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(read_all, range(16)))
    expected = read_all(0)
    assert all(result == expected for result in results)
    assert sorted(expected) == sorted([64.0 * i for i in range(8)] * 2)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"dtype": "float99", "shape": [1]}, "unknown dtype 'float99'"),
        ({"dtype": "float32", "shape": [-1]}, "non-negative ints"),
        ({"dtype": "float32"}, "lacks shape"),
        ([1, 2], "must be an object"),
        (
            {"dtype": "float32", "shape": [1], "safetensors_file": "/nonexistent/m.safetensors"},
            "not an existing",
        ),
    ],
)
def test_malformed_entries_are_named(tmp_path: Path, entry, message: str) -> None:
    (tmp_path / "index.json").write_text(json.dumps({"layer.weight": entry}))
    with pytest.raises(CheckpointError, match=message) as info:
        load_offload_index(tmp_path)
    assert "'layer.weight'" in str(info.value)


def test_safetensors_pointer_must_be_a_safetensors_file(tmp_path: Path) -> None:
    pickle_like = tmp_path / "model.bin"
    pickle_like.write_bytes(b"not safetensors")
    entry = {"dtype": "float32", "shape": [1], "safetensors_file": str(pickle_like)}
    with pytest.raises(CheckpointError, match=r"\*\.safetensors"):
        OffloadedWeightsLoader(index={"w": entry})


def test_malformed_json_and_save_refuses_to_clobber_it(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_offload_index(tmp_path)
    with pytest.raises(CheckpointError, match="not valid JSON"):
        save_offload_index({"w": {"dtype": "float32", "shape": [1]}}, tmp_path)
    assert (tmp_path / "index.json").read_text() == "{not json"


def test_truncated_raw_file_is_reported_with_sizes(tmp_path: Path) -> None:
    offload_state_dict(tmp_path, {"w": torch.ones(8)})
    with open(tmp_path / "w.dat", "r+b") as handle:
        handle.truncate(20)
    with pytest.raises(CheckpointError, match=r"holds 20 B but float32\[8\] needs 32 B"):
        OffloadedWeightsLoader(save_folder=tmp_path)["w"]
    (tmp_path / "w.dat").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        OffloadedWeightsLoader(save_folder=tmp_path)["w"]


def test_safetensors_pointer_entries(tmp_path: Path) -> None:
    checkpoint = tmp_path / "model.safetensors"
    stored = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    save_file({"enc.weight": stored}, str(checkpoint))
    index = {
        "layer.weight": {
            "dtype": "float32",
            "shape": [2, 3],
            "safetensors_file": str(checkpoint),
            "weight_name": "enc.weight",
        },
        "as_half": {
            "dtype": "float16",
            "shape": [2, 3],
            "safetensors_file": str(checkpoint),
            "weight_name": "enc.weight",
        },
    }
    loader = OffloadedWeightsLoader(index=index)
    assert torch.equal(loader["layer.weight"], stored)
    assert loader["as_half"].dtype == torch.float16
    assert torch.equal(loader["as_half"], stored.half())

    wrong = {"w": {**index["layer.weight"], "shape": [3, 2]}}
    with pytest.raises(CheckpointError, match=r"has shape \[2, 3\].*records \[3, 2\]"):
        OffloadedWeightsLoader(index=wrong)["w"]


def test_loader_prefers_state_dict_and_unions_keys(tmp_path: Path) -> None:
    offload_state_dict(tmp_path, {"a": torch.zeros(2), "b": torch.ones(2)})
    in_memory = {"b": torch.full((2,), 5.0), "c": torch.full((1,), 9.0)}
    loader = OffloadedWeightsLoader(state_dict=in_memory, save_folder=tmp_path)
    assert list(loader) == ["b", "c", "a"]
    assert len(loader) == 3
    assert "a" in loader and "z" not in loader
    assert loader["b"] is in_memory["b"]
    assert torch.equal(loader["a"], torch.zeros(2))
    with pytest.raises(KeyError):
        loader["z"]
    with pytest.raises(ValueError, match="needs a state_dict"):
        OffloadedWeightsLoader()
    with pytest.raises(CheckpointError, match="no save_folder"):
        OffloadedWeightsLoader(index={"a": {"dtype": "float32", "shape": [2]}})["a"]


def test_prefixed_dataset_strips_prefix() -> None:
    data = {"h.0.weight": torch.ones(1), "h.0.bias": torch.zeros(1), "h.01.weight": torch.ones(2)}
    view = PrefixedDataset(data, "h.0.")
    assert list(view) == ["weight", "bias"]
    assert len(view) == 2
    assert "weight" in view and "h.0.weight" not in view
    assert view["bias"] is data["h.0.bias"]


def test_remove_offloaded_files(tmp_path: Path) -> None:
    offload_state_dict(tmp_path, {"a": torch.ones(4), "b": torch.ones(2)})
    assert remove_offloaded_files(tmp_path, ["a", "never-written"]) == 16  # 4 * 4 B
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.dat", "index.json"]
    assert list(load_offload_index(tmp_path)) == ["b"]


def test_meta_tensor_cannot_be_offloaded(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="cannot offload 'w'"):
        offload_weight(torch.empty(2, device="meta"), "w", tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.gpu
def test_cuda_round_trip_and_loader_device(tmp_path: Path) -> None:
    weight = torch.randn(64, 64, device="cuda").to(torch.bfloat16)
    offload_state_dict(tmp_path, {"w": weight})
    loaded = OffloadedWeightsLoader(save_folder=tmp_path, device=0)["w"]
    assert loaded.device == torch.device("cuda:0")
    assert torch.equal(_bits(loaded), _bits(weight))


def test_a_failed_swap_puts_every_replaced_file_back(tmp_path: Path, monkeypatch) -> None:
    """Re-offloading over an existing folder: when a rename fails midway (the OS refuses it),
    the files already swapped in go back, so the old index still names the old bytes."""
    old = {"a": torch.full((4,), 1.0), "b": torch.full((4,), 2.0), "c": torch.full((4,), 3.0)}
    offload_state_dict(tmp_path, old)
    real_replace = file_swap.os.replace

    def refuse_the_second_swap(src, dst):  # os is shared: pick the swap of b's new data
        if str(src).endswith(".tmp") and Path(dst).name == "b.dat":
            raise OSError(5, "Input/output error")
        return real_replace(src, dst)

    monkeypatch.setattr(file_swap.os, "replace", refuse_the_second_swap)
    new = {name: torch.full((8,), 9.0, dtype=torch.float16) for name in old}
    with pytest.raises(OffloadError, match="previous index and its files are unchanged"):
        offload_state_dict(tmp_path, new)
    monkeypatch.setattr(file_swap.os, "replace", real_replace)
    loader = OffloadedWeightsLoader(save_folder=tmp_path, map_cache_bytes=0)
    for name, tensor in old.items():
        torch.testing.assert_close(loader[name], tensor, rtol=0, atol=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.dat", "b.dat", "c.dat", "index.json"]


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_a_pointer_into_a_safetensors_file_is_read_from_its_memory_map(tmp_path: Path) -> None:
    """Zero copy, as a raw ``.dat`` entry (safetensors maps the file): the tensor lies in a
    mapping of the checkpoint file, file-backed pages the kernel may reclaim, which is how the
    memory model counts a disk weight that runs on the CPU, not a fresh anonymous copy."""
    weights = {"a": torch.arange(4096, dtype=torch.float32), "b": torch.ones(3, 5)}
    checkpoint = tmp_path / "model.safetensors"
    save_file(weights, str(checkpoint))
    index = {
        name: {
            "dtype": "float32",
            "shape": list(tensor.shape),
            "safetensors_file": str(checkpoint),
            "weight_name": name,
        }
        for name, tensor in weights.items()
    }
    loader = OffloadedWeightsLoader(index=index)
    for name, tensor in weights.items():
        read = loader[name]
        assert torch.equal(read, tensor)
        address = read.data_ptr()
        spans = [
            tuple(int(bound, 16) for bound in line.split()[0].split("-"))
            for line in Path("/proc/self/maps").read_text().splitlines()
            if line.endswith(str(checkpoint))
        ]
        assert any(start <= address < end for start, end in spans), name
