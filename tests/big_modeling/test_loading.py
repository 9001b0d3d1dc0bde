"""load_checkpoint_in_model: layouts, dtype rules, keys, ties, in-place loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import checkpoint_fixtures as fx
import pytest
import torch
from checkpoint_fixtures import (
    TinyNet,
    empty_model,
    make_reference,
    state_without_tie_copy,
)
from safetensors.torch import save_file

from workbench.big_modeling import load_checkpoint_in_model
from workbench.big_modeling.errors import CheckpointError, DeviceMapError

# session fixtures shared with the other loading tests
reference_model = fx.reference_model
sharded_ckpt = fx.sharded_ckpt
single_ckpt = fx.single_ckpt
fp16_ckpt = fx.fp16_ckpt


IDS = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 15]])


def _assert_same_model(model: TinyNet, reference: TinyNet) -> None:
    for name, tensor in reference.state_dict().items():
        got = model.state_dict()[name]
        assert got.device.type == "cpu", name
        assert got.dtype == tensor.dtype and torch.equal(got, tensor), name
    torch.testing.assert_close(model.eval()(IDS), reference(IDS), rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["folder", "index_json", "cpu_map", "single", "bin"])
def test_loads_every_layout_bitwise(
    layout: str, sharded_ckpt: Path, single_ckpt: Path, reference_model: TinyNet, tmp_path: Path
) -> None:
    kwargs = {}
    path = {
        "folder": sharded_ckpt,
        "index_json": sharded_ckpt / "model.safetensors.index.json",
        "cpu_map": sharded_ckpt,
        "single": single_ckpt / "model.safetensors",
    }.get(layout)
    if layout == "cpu_map":
        kwargs["device_map"] = {"": "cpu"}
    if layout == "bin":
        torch.save(state_without_tie_copy(reference_model), tmp_path / "pytorch_model.bin")
        path = tmp_path
    model = empty_model()
    result = load_checkpoint_in_model(model, path, **kwargs)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert result.nbytes_read == 4760
    _assert_same_model(model, reference_model)
    assert model.head.weight is model.embed.weight  # the tie survives
    assert model.scratch.device.type == "cpu"  # non-persistent buffer left alone


def test_tie_stored_only_under_the_other_name(tmp_path: Path, reference_model: TinyNet) -> None:
    state = dict(reference_model.state_dict())
    state.pop("embed.weight")  # store head.weight only
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "model.safetensors")
    model = empty_model()
    assert load_checkpoint_in_model(model, tmp_path).missing_keys == []
    assert model.embed.weight is model.head.weight
    _assert_same_model(model, reference_model)


def test_tie_stored_twice_loads_once(tmp_path: Path, reference_model: TinyNet) -> None:
    state = {k: v.detach().clone() for k, v in reference_model.state_dict().items()}
    save_file(state, tmp_path / "model.safetensors")
    model = empty_model()
    result = load_checkpoint_in_model(model, tmp_path, device_map={"": "cpu"})
    assert result.nbytes_read == 4760  # 16*8*4 = 512 B of head.weight not read again
    assert model.embed.weight is model.head.weight


def test_dtype_casts_floats_only_and_keeps_fp32_modules(
    sharded_ckpt: Path, reference_model: TinyNet
) -> None:
    model = empty_model()
    load_checkpoint_in_model(
        model, sharded_ckpt, dtype="float16", keep_in_fp32_modules=["norm", "blocks.1.bn"]
    )
    assert model.embed.weight.dtype == torch.float16
    assert model.blocks[0].bn.running_var.dtype == torch.float16
    assert model.norm.weight.dtype == torch.float32  # kept
    assert model.blocks[1].bn.running_mean.dtype == torch.float32  # kept, dotted key
    assert model.blocks[1].up.weight.dtype == torch.float16  # "blocks.1" alone is not listed
    assert model.position_ids.dtype == torch.int64  # ints never cast
    assert model.blocks[0].bn.num_batches_tracked.dtype == torch.int64
    assert torch.equal(model.embed.weight, reference_model.embed.weight.to(torch.float16))


def test_keep_in_fp32_matches_whole_components(sharded_ckpt: Path) -> None:
    model = empty_model()
    load_checkpoint_in_model(
        model, sharded_ckpt, dtype=torch.bfloat16, keep_in_fp32_modules=["orm"]
    )
    assert model.norm.weight.dtype == torch.bfloat16  # "orm" is not a component of "norm"


def test_dtype_none_takes_model_dtype(fp16_ckpt: tuple[TinyNet, Path]) -> None:
    reference, folder = fp16_ckpt
    fp32_model = empty_model(torch.float32)
    load_checkpoint_in_model(fp32_model, folder)
    assert fp32_model.embed.weight.dtype == torch.float32
    assert torch.equal(fp32_model.embed.weight, reference.embed.weight.float())
    fp16_model = empty_model(torch.float16)
    load_checkpoint_in_model(fp16_model, folder)
    _assert_same_model(fp16_model, reference)


def test_missing_and_unexpected_keys_warned_sorted(
    tmp_path: Path, reference_model: TinyNet, caplog: pytest.LogCaptureFixture
) -> None:
    state = state_without_tie_copy(reference_model)
    state.pop("norm.bias")
    state.pop("blocks.2.down.bias")
    state["zz.extra"] = torch.ones(1)
    state["aa.extra"] = torch.ones(1)
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "model.safetensors")
    model = empty_model()
    with pytest.warns(UserWarning) as record:
        result = load_checkpoint_in_model(model, tmp_path)
    messages = [str(w.message) for w in record]
    # unexpected keys are logged, as the reference does ("were not used when initializing")
    assert any(
        "2 checkpoint tensor(s) were not used when initializing TinyNet" in r.getMessage()
        and r.getMessage().endswith("were skipped: aa.extra, zz.extra")
        and r.levelname == "WARNING"
        for r in caplog.records
    )
    assert any(
        "2 tensor(s) of TinyNet are not in the checkpoint" in m
        and m.endswith("blocks.2.down.bias, norm.bias")
        for m in messages
    )
    assert result.missing_keys == ["blocks.2.down.bias", "norm.bias"]
    assert model.norm.bias.device.type == "meta"  # documented: missing tensors stay as they were
    for device_map in (None, {"": "cpu"}):
        strict_model = empty_model()
        with pytest.raises(
            CheckpointError,
            match=r"strict=True.*2 missing key\(s\): blocks\.2\.down\.bias, norm\.bias; 2 unexpected key\(s\): aa\.extra, zz\.extra",
        ):
            load_checkpoint_in_model(strict_model, tmp_path, device_map=device_map, strict=True)
        assert strict_model.embed.weight.device.type == "meta"


def test_in_place_load_keeps_parameter_identity(
    single_ckpt: Path, reference_model: TinyNet
) -> None:
    model = make_reference(seed=123)
    weight = model.blocks[0].up.weight
    pointer = weight.data_ptr()
    load_checkpoint_in_model(model, single_ckpt)
    assert model.blocks[0].up.weight is weight and weight.data_ptr() == pointer
    _assert_same_model(model, reference_model)


def test_in_place_with_requested_dtype_replaces(single_ckpt: Path) -> None:
    model = make_reference(seed=5)
    load_checkpoint_in_model(model, single_ckpt, dtype=torch.bfloat16)
    assert model.blocks[0].up.weight.dtype == torch.bfloat16
    assert model.head.weight is model.embed.weight


def test_bad_device_map_values(single_ckpt: Path) -> None:
    with pytest.raises(DeviceMapError, match="'gpu0' is not a device"):
        load_checkpoint_in_model(empty_model(), single_ckpt, device_map={"": "gpu0"})
    with pytest.raises(DeviceMapError, match="is not a map"):
        load_checkpoint_in_model(empty_model(), single_ckpt, device_map="everywhere")


def test_meta_device_in_map_leaves_tensor_on_meta(single_ckpt: Path) -> None:
    model = empty_model()
    load_checkpoint_in_model(
        model, single_ckpt, device_map={"": "cpu", "blocks.2": "meta"}, dtype=torch.float16
    )
    assert model.blocks[2].up.weight.device.type == "meta"
    assert model.blocks[2].up.weight.dtype == torch.float16
    assert model.blocks[1].up.weight.device.type == "cpu"


def test_offload_8bit_bnb_not_supported(single_ckpt: Path) -> None:
    with pytest.raises(NotImplementedError, match="bitsandbytes"):
        load_checkpoint_in_model(empty_model(), single_ckpt, offload_8bit_bnb=True)


def test_mapped_weights_are_copy_on_write(
    single_ckpt: Path, reference_model: TinyNet, tmp_path: Path
) -> None:
    folder = tmp_path / "ck"
    shutil.copytree(single_ckpt, folder)
    before = (folder / "model.safetensors").read_bytes()
    mapped = empty_model()
    load_checkpoint_in_model(mapped, folder)  # mmap=True: zero copy
    eager = empty_model()
    load_checkpoint_in_model(eager, folder, mmap=False)
    _assert_same_model(mapped, reference_model)
    _assert_same_model(eager, reference_model)
    with torch.no_grad():
        mapped.norm.weight.add_(1.0)
    assert (folder / "model.safetensors").read_bytes() == before  # the file never changes
    assert torch.equal(mapped.norm.weight, reference_model.norm.weight + 1.0)
