"""Loading inputs the layout tests leave out: pickled files and shards, bool buffers, fp32
modules without a dtype, dispatch pass-through options, unknown map keys, created folders."""

from __future__ import annotations

import json
from pathlib import Path

import checkpoint_fixtures as fx
import pytest
import torch
from checkpoint_fixtures import TinyNet, empty_model, state_without_tie_copy
from safetensors.torch import save_file
from torch import nn

from workbench.big_modeling import (
    CancelToken,
    LoadCancelled,
    LoadProgress,
    OffloadedWeightsLoader,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
)
from workbench.big_modeling.empty_init import init_empty_weights
from workbench.big_modeling.errors import DeviceMapError
from workbench.big_modeling.hooks.align import AlignDevicesHook

reference_model = fx.reference_model
sharded_ckpt = fx.sharded_ckpt
single_ckpt = fx.single_ckpt

IDS = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 15]])
TWO_TIER_MAP = {"": "cpu", "blocks.1": "disk"}


def _assert_state_equal(model: nn.Module, reference: nn.Module) -> None:
    expected = reference.state_dict()
    got = model.state_dict()
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        assert got[name].dtype == value.dtype and torch.equal(got[name], value), name


@pytest.mark.parametrize("suffix", [".bin", ".pt"])
def test_pickled_file_passed_directly(
    suffix: str, reference_model: TinyNet, tmp_path: Path
) -> None:
    path = tmp_path / f"weights{suffix}"
    torch.save(state_without_tie_copy(reference_model), path)
    model = empty_model()
    load_checkpoint_in_model(model, path)
    _assert_state_equal(model, reference_model)
    assert model.head.weight is model.embed.weight
    torch.testing.assert_close(model.eval()(IDS), reference_model(IDS), rtol=0, atol=0)


def test_sharded_bin_index(reference_model: TinyNet, tmp_path: Path) -> None:
    state = state_without_tie_copy(reference_model)
    names = sorted(state)
    weight_map = {}
    for k, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :]), start=1):
        shard = f"pytorch_model-0000{k}-of-00002.bin"
        torch.save({name: state[name] for name in part}, tmp_path / shard)
        weight_map.update(dict.fromkeys(part, shard))
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    model = empty_model()
    load_checkpoint_in_model(model, tmp_path)
    _assert_state_equal(model, reference_model)
    # pickled shards have no file to point into: disk weights are written out
    disk = empty_model()
    result = load_checkpoint_in_model(
        disk,
        tmp_path / "pytorch_model.bin.index.json",
        device_map=TWO_TIER_MAP,
        offload_folder=tmp_path / "off",
    )
    block = {k: v for k, v in state.items() if k.startswith("blocks.1.") and v.is_floating_point()}
    # blocks.1 parameters only (buffers stay on CPU): 16*8 + 16 + 2*16 + 8*16 + 8 = 312 fp32
    assert result.offload_nbytes_written == 312 * 4
    weights = OffloadedWeightsLoader(save_folder=tmp_path / "off")
    for name in ("blocks.1.up.weight", "blocks.1.down.bias"):
        assert torch.equal(weights[name], block[name])


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("mask", torch.zeros(4, dtype=torch.bool))


@pytest.mark.parametrize("device_map", [None, {"": "cpu"}, {"proj": "cpu", "mask": "disk"}])
def test_bool_buffers_never_cast(device_map: dict | None, tmp_path: Path) -> None:
    mask = torch.tensor([True, False, True, True])
    torch.manual_seed(0)
    source = Masked()
    source.mask.copy_(mask)
    save_file(dict(source.state_dict()), tmp_path / "model.safetensors")
    with init_empty_weights():
        model = Masked()
    load_checkpoint_in_model(
        model,
        tmp_path,
        device_map=device_map,
        offload_folder=tmp_path / "off",
        dtype=torch.float16,
        offload_buffers=True,
    )
    assert model.proj.weight.dtype == torch.float16
    if device_map is not None and device_map.get("mask") == "disk":
        assert model.mask.device.type == "meta" and model.mask.dtype == torch.bool
        value = OffloadedWeightsLoader(save_folder=tmp_path / "off")["mask"]
    else:
        value = model.mask
    assert value.dtype == torch.bool and torch.equal(value, mask)


def test_keep_in_fp32_modules_without_dtype(single_ckpt: Path, reference_model: TinyNet) -> None:
    model = empty_model(torch.float16)
    load_checkpoint_in_model(model, single_ckpt, keep_in_fp32_modules=["norm"])
    assert model.norm.weight.dtype == model.norm.bias.dtype == torch.float32
    assert torch.equal(model.norm.weight, reference_model.norm.weight)  # never rounded to fp16
    assert model.blocks[0].up.weight.dtype == torch.float16
    assert torch.equal(model.blocks[0].up.weight, reference_model.blocks[0].up.weight.half())
    assert model.position_ids.dtype == torch.int64


def _align_hooks(model: nn.Module) -> dict[str, AlignDevicesHook]:
    found = {}
    for name, module in model.named_modules():
        hook = getattr(module, "_hf_hook", None)
        for inner in getattr(hook, "hooks", [hook]):
            if isinstance(inner, AlignDevicesHook):
                found[name] = inner
    return found


def test_dispatch_passes_force_hooks(sharded_ckpt: Path, reference_model: TinyNet) -> None:
    plain = load_checkpoint_and_dispatch(empty_model(), sharded_ckpt, device_map={"": "cpu"})
    assert _align_hooks(plain) == {}
    forced = load_checkpoint_and_dispatch(
        empty_model(), sharded_ckpt, device_map={"": "cpu"}, force_hooks=True
    )
    assert _align_hooks(forced)
    torch.testing.assert_close(forced.eval()(IDS), reference_model(IDS), rtol=0, atol=0)


def test_dispatch_passes_skip_keys_and_preload_classes(
    sharded_ckpt: Path, reference_model: TinyNet, tmp_path: Path
) -> None:
    model = load_checkpoint_and_dispatch(
        empty_model(),
        sharded_ckpt,
        device_map=TWO_TIER_MAP,
        offload_folder=tmp_path / "off",
        skip_keys=["cache"],
        preload_module_classes=["Block"],
    )
    hooks = _align_hooks(model)
    assert hooks and all(hook.skip_keys == ["cache"] for hook in hooks.values())
    # the disk Block is loaded whole by one hook; its children get none
    assert hooks["blocks.1"].place_submodules
    assert not any(name.startswith("blocks.1.") for name in hooks)
    assert "blocks.0.up" in hooks  # CPU blocks are not preloaded (nothing offloaded)
    torch.testing.assert_close(model.eval()(IDS), reference_model(IDS), rtol=0, atol=0)


MISSPELT_MAP = {"": "cpu", "blokcs.1": "disk"}


@pytest.mark.parametrize(
    "load", [load_checkpoint_in_model, load_checkpoint_and_dispatch], ids=lambda f: f.__name__
)
def test_unknown_map_key_fails_before_reading(load, sharded_ckpt: Path, tmp_path: Path) -> None:
    reports: list[LoadProgress] = []
    model = empty_model()
    with pytest.raises(DeviceMapError, match=r"does not have: blokcs\.1\. Check the spelling"):
        load(
            model,
            sharded_ckpt,
            device_map=MISSPELT_MAP,
            offload_folder=tmp_path / "off",
            progress=reports.append,
        )
    assert reports == [] and not (tmp_path / "off").exists()
    assert all(p.device.type == "meta" for p in model.parameters())
    assert not hasattr(model, "hf_device_map")
    # checked before the checkpoint is even opened
    with pytest.raises(DeviceMapError, match=r"blokcs\.1"):
        load(empty_model(), tmp_path / "absent", device_map=MISSPELT_MAP)


def _cancel_after_first_tensor(token: CancelToken):
    def progress(report: LoadProgress) -> None:
        if report.bytes_done:
            token.cancel()

    return progress


@pytest.mark.parametrize("existed", [False, True])
def test_cancelled_load_removes_only_the_folder_it_created(
    existed: bool, sharded_ckpt: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "new" / "nested" / "off"
    if existed:
        folder.mkdir(parents=True)
    token = CancelToken()
    with pytest.raises(LoadCancelled):
        load_checkpoint_in_model(
            empty_model(),
            sharded_ckpt,
            device_map={"": "disk", "embed": "cpu", "head": "cpu"},
            offload_folder=folder,
            dtype=torch.float16,  # disk weights are written, not pointed to
            progress=_cancel_after_first_tensor(token),
            cancel=token,
        )
    if existed:
        assert folder.is_dir() and list(folder.iterdir()) == []
    else:
        assert list(tmp_path.iterdir()) == []  # new/nested/off all removed
