"""Every bad checkpoint fails with an error naming the file, the tensor/key and the problem,
before the model or any folder changes."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import checkpoint_fixtures as fx
import pytest
import torch
from checkpoint_fixtures import (
    TinyNet,
    empty_model,
    write_safetensors_raw,
)
from safetensors.torch import save_file

from workbench.big_modeling.errors import (
    BadInputError,
    CheckpointError,
    DeviceMapError,
    OffloadError,
)
from workbench.big_modeling.loading.api import load_checkpoint_in_model
from workbench.big_modeling.loading.index import CheckpointIndex

F32_2X2 = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}

# session fixtures shared with the other loading tests
reference_model = fx.reference_model
sharded_ckpt = fx.sharded_ckpt
single_ckpt = fx.single_ckpt


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _assert_untouched(model: TinyNet) -> None:
    on_meta = [n for n, p in model.named_parameters() if p.device.type != "meta"]
    assert on_meta == [], f"parameters changed by a failed load: {on_meta}"


def _load_fails(path: Path, match: str, error: type[Exception] = CheckpointError, **kwargs) -> None:
    model = empty_model()
    with pytest.raises(error, match=match):
        load_checkpoint_in_model(model, path, **kwargs)
    _assert_untouched(model)


def test_truncated_safetensors_names_file_and_tensor(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.ones(4), "b": torch.ones(8)}, path)
    data = path.read_bytes()
    path.write_bytes(data[:-5])  # cut the end of tensor "b"
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*truncated.*: b"):
        CheckpointIndex.from_path(path)
    assert path.read_bytes() == data[:-5]


def test_header_length_larger_than_file(tmp_path: Path) -> None:
    path = write_safetensors_raw(tmp_path / "x.safetensors", F32_2X2, bytes(16), header_len=10_000)
    with pytest.raises(
        CheckpointError, match=r"x\.safetensors: declares a 10000-byte header but the file has only"
    ):
        CheckpointIndex.from_path(path)


def test_header_length_absurd(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 2**62) + b"{}")
    with pytest.raises(CheckpointError, match=r"above the .*-byte limit"):
        CheckpointIndex.from_path(path)


def test_header_not_json(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    raw = b'{"w": {"dtype": "F32", '
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(16))
    with pytest.raises(CheckpointError, match=r"x\.safetensors header: not valid JSON \(line 1"):
        CheckpointIndex.from_path(path)


def test_header_json_not_object(tmp_path: Path) -> None:
    path = write_safetensors_raw(tmp_path / "x.safetensors", [1, 2], b"")  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="header is a JSON list, expected an object"):
        CheckpointIndex.from_path(path)


def test_unknown_dtype_names_tensor(tmp_path: Path) -> None:
    header = {"w": {"dtype": "F17", "shape": [2, 2], "data_offsets": [0, 16]}}
    path = write_safetensors_raw(tmp_path / "x.safetensors", header, bytes(16))
    with pytest.raises(
        CheckpointError,
        match=r"x\.safetensors: tensor 'w': unknown dtype 'F17'.*Known dtypes: BF16",
    ):
        CheckpointIndex.from_path(path)


def test_offsets_out_of_range(tmp_path: Path) -> None:
    header = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [100, 116]}}
    path = write_safetensors_raw(tmp_path / "x.safetensors", header, bytes(16))
    with pytest.raises(CheckpointError, match=r"out of range.*: w"):
        CheckpointIndex.from_path(path)


def test_offsets_overlapping(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
    }
    path = write_safetensors_raw(tmp_path / "x.safetensors", header, bytes(24))
    with pytest.raises(CheckpointError, match="tensors 'a' and 'b' have overlapping data offsets"):
        CheckpointIndex.from_path(path)


def test_offsets_disagree_with_shape(tmp_path: Path) -> None:
    header = {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}}
    path = write_safetensors_raw(tmp_path / "x.safetensors", header, bytes(16))
    with pytest.raises(
        CheckpointError,
        match=r"tensor 'w': data_offsets \[0, 16\] span 16 bytes but shape \(2, 3\) of F32 needs 24",
    ):
        CheckpointIndex.from_path(path)


def test_gap_between_tensors(tmp_path: Path) -> None:
    header = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}
    path = write_safetensors_raw(tmp_path / "x.safetensors", header, bytes(16))
    with pytest.raises(CheckpointError, match="tensor 'w' starts at byte 8, leaving a gap"):
        CheckpointIndex.from_path(path)


def test_bad_shape_value(tmp_path: Path) -> None:
    header = {"w": {"dtype": "F32", "shape": [2, -2], "data_offsets": [0, 16]}}
    path = write_safetensors_raw(tmp_path / "x.safetensors", header, bytes(16))
    with pytest.raises(
        CheckpointError, match=r"tensor 'w': shape \[2, -2\] is not a list of non-negative ints"
    ):
        CheckpointIndex.from_path(path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"")
    _load_fails(path, r"model\.safetensors: is empty \(0 bytes\)")


def test_empty_bin_file(tmp_path: Path) -> None:
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(b"")
    _load_fails(path, r"pytorch_model\.bin: is empty")


def test_directory_where_file_expected(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").mkdir()
    (tmp_path / "model.safetensors" / "junk").write_text("x")
    _load_fails(
        tmp_path / "model.safetensors",
        re.escape(
            f"{tmp_path / 'model.safetensors'}: is a directory, expected a checkpoint file; "
            "as a folder it holds no weights"
        ),
    )
    index = {"weight_map": {"w": "shard.safetensors"}}
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "shard.safetensors").mkdir()
    (tmp_path / "ck" / "model.safetensors.index.json").write_text(json.dumps(index))
    _load_fails(
        tmp_path / "ck",
        re.escape(
            f"{tmp_path / 'ck' / 'shard.safetensors'}: is a directory, "
            "expected a shard file named in model.safetensors.index.json"
        ),
    )


def test_shard_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "shard.safetensors").mkdir()
    (tmp_path / "i.index.json").write_text(json.dumps({"weight_map": {"w": "shard.safetensors"}}))
    expected = f"{tmp_path / 'shard.safetensors'}: is a directory, expected a shard file named in i.index.json"
    with pytest.raises(CheckpointError, match=f"^{re.escape(expected)}$"):
        CheckpointIndex.from_path(tmp_path / "i.index.json")


@pytest.mark.parametrize("passed", ["index", "folder"])
def test_index_json_is_a_directory(tmp_path: Path, passed: str) -> None:
    (tmp_path / "model.safetensors.index.json").mkdir()
    expected = (
        f"{tmp_path / 'model.safetensors.index.json'}: is a directory; expected an index JSON file"
    )
    path = tmp_path / "model.safetensors.index.json" if passed == "index" else tmp_path
    _load_fails(path, f"^{re.escape(expected)}")


def test_missing_path() -> None:
    _load_fails(Path("/nonexistent/ckpt"), r"/nonexistent/ckpt: no such file or folder")


def test_index_json_malformed(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"a": ')
    _load_fails(tmp_path, r"model\.safetensors\.index\.json: not valid JSON \(line 1")


def test_index_json_without_weight_map(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": []}')
    _load_fails(tmp_path, "expected a non-empty 'weight_map' object")


def test_weight_map_names_missing_shard(sharded_ckpt: Path, tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    shutil.copytree(sharded_ckpt, folder)
    (folder / "model-00002-of-00003.safetensors").unlink()
    before = _snapshot(folder)
    _load_fails(
        folder, r"names 1 shard\(s\) that do not exist .*: model-00002-of-00003\.safetensors"
    )
    assert _snapshot(folder) == before


@pytest.mark.parametrize(
    "shard",
    ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors", "C:\\x.safetensors"],
)
def test_weight_map_escaping_paths_refused(tmp_path: Path, shard: str) -> None:
    outside = tmp_path / "outside.safetensors"
    save_file({"embed.weight": torch.zeros(16, 8)}, outside)
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"embed.weight": shard}})
    )
    _load_fails(folder, "points outside the checkpoint folder")


def test_weight_map_tensor_missing_from_shard(single_ckpt: Path, tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    folder.mkdir()
    shutil.copy(single_ckpt / "model.safetensors", folder / "shard.safetensors")
    weight_map = {"embed.weight": "shard.safetensors", "ghost.weight": "shard.safetensors"}
    (folder / "x.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _load_fails(folder, r"missing from their shard: ghost\.weight \(in shard\.safetensors\)")


def test_folder_with_two_index_files(sharded_ckpt: Path, tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    shutil.copytree(sharded_ckpt, folder)
    shutil.copy(folder / "model.safetensors.index.json", folder / "pytorch_model.bin.index.json")
    _load_fails(
        folder,
        r"holds 2 index files \(model\.safetensors\.index\.json, pytorch_model\.bin\.index\.json\)",
    )


def test_folder_without_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    _load_fails(
        tmp_path, r"holds no weights: expected model\.safetensors.*found \['config\.json'\]"
    )


def test_shape_mismatch_names_both_shapes(tmp_path: Path) -> None:
    state = dict(TinyNet().state_dict())
    state["blocks.1.up.weight"] = torch.zeros(16, 4)
    save_file(
        {k: v.contiguous() for k, v in state.items() if k != "head.weight"},
        tmp_path / "model.safetensors",
    )
    _load_fails(tmp_path, r"blocks\.1\.up\.weight: checkpoint \(16, 4\) vs model \(16, 8\)")


def test_float_into_integer_buffer_cannot_be_cast(tmp_path: Path) -> None:
    state = dict(TinyNet().state_dict())
    state["position_ids"] = torch.zeros(4, dtype=torch.float16)
    save_file(
        {k: v.contiguous() for k, v in state.items() if k != "head.weight"},
        tmp_path / "model.safetensors",
    )
    _load_fails(
        tmp_path,
        r"tensor 'position_ids' is torch\.float16 in the checkpoint but torch\.int64 in the model",
    )


def test_integer_into_float_parameter_cannot_be_cast(tmp_path: Path) -> None:
    state = dict(TinyNet().state_dict())
    state["norm.weight"] = torch.ones(8, dtype=torch.int32)
    save_file(
        {k: v.contiguous() for k, v in state.items() if k != "head.weight"},
        tmp_path / "model.safetensors",
    )
    _load_fails(
        tmp_path, r"tensor 'norm\.weight' is torch\.int32 in the checkpoint but torch\.float32"
    )


def test_requested_dtype_not_floating(single_ckpt: Path) -> None:
    _load_fails(single_ckpt, "not a floating dtype", BadInputError, dtype=torch.int8)
    _load_fails(single_ckpt, "is not a torch dtype", BadInputError, dtype="float17")


def test_malicious_pickle_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "pytorch_model.bin"
    with open(path, "wb") as handle:
        pickle.dump({"embed.weight": Exploit()}, handle)
    _load_fails(path, r"pytorch_model\.bin: refused to unpickle")
    torch.save({"embed.weight": Exploit()}, tmp_path / "zip.bin")
    _load_fails(tmp_path / "zip.bin", r"zip\.bin: refused to unpickle")
    assert not marker.exists(), "the pickle's code ran"


def test_pickle_not_a_state_dict(tmp_path: Path) -> None:
    torch.save([torch.ones(2)], tmp_path / "x.pt")
    _load_fails(tmp_path / "x.pt", r"x\.pt: holds a list, expected a dict of tensors")


def test_disk_without_offload_folder(single_ckpt: Path) -> None:
    _load_fails(single_ckpt, "no offload_folder was given", OffloadError, device_map={"": "disk"})


def test_device_map_missing_tensors(single_ckpt: Path) -> None:
    _load_fails(
        single_ckpt,
        r"no device for .*: blocks\.0\.bn\.bias, ",
        DeviceMapError,
        device_map={"embed": "cpu"},
    )


def test_offload_folder_is_a_file(single_ckpt: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    _load_fails(
        single_ckpt,
        "offload folder .* is not writable",
        OffloadError,
        device_map={"": "disk"},
        offload_folder=blocker / "off",
    )
    assert blocker.read_text() == "mine"


def _unwritable_folder(tmp_path: Path) -> Path:
    """A folder the OS refuses to let this process create or write, root included."""
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    # sysfs refuses mkdir to everyone, root too (EPERM, or EROFS where /sys is mounted read-only)
    sysfs = Path("/sys/kernel")
    if not sysfs.is_dir():
        pytest.skip("running as root without /sys/kernel: no folder the OS refuses to root")
    return sysfs / "workbench-offload-test"


def test_offload_folder_not_writable(single_ckpt: Path, tmp_path: Path) -> None:
    folder = _unwritable_folder(tmp_path)
    try:
        _load_fails(
            single_ckpt,
            re.escape(f"offload folder {folder} is not writable"),
            OffloadError,
            device_map={"": "disk"},
            offload_folder=folder,
            dtype=torch.float16,
        )
    finally:
        if folder.is_relative_to(tmp_path):
            folder.chmod(0o755)
    assert not folder.exists() or not any(folder.iterdir())


DISK_FULL_SCRIPT = textwrap.dedent(
    """
    import resource, signal, sys, warnings
    sys.path.insert(0, {tests!r})
    import torch
    from checkpoint_fixtures import empty_model
    from workbench.big_modeling.errors import OffloadError
    from workbench.big_modeling.loading.api import load_checkpoint_in_model
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))  # no file may exceed 200 B
    try:
        load_checkpoint_in_model(empty_model(), {ckpt!r}, device_map={{"": "disk"}},
                                 offload_folder={folder!r}, dtype=torch.float16)
    except OffloadError as exc:
        print("OffloadError:", exc)
        sys.exit(3)
    """
)


@pytest.mark.slow  # a fresh interpreter (torch import) with a file-size limit
def test_disk_full_while_offloading_leaves_no_partial_index(
    single_ckpt: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "off"
    folder.mkdir()
    (folder / "keep.txt").write_text("user file")
    script = DISK_FULL_SCRIPT.format(
        tests=str(Path(__file__).parent), ckpt=str(single_ckpt), folder=str(folder)
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stdout + done.stderr
    # BatchNorm vectors (16 fp16 = 32 B) are staged first; the 16*8 fp16 = 256 B weights fail
    assert "cannot write tensor" in done.stdout and "File too large" in done.stdout
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]
