"""dispatch_model's checks and extras: errors, main device, stale buffers, ties, pipelines."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.big_modeling.dispatch import (
    _main_device,
    disk_offload,
    dispatch_model,
)
from workbench.big_modeling.errors import CheckpointError, DeviceMapError
from workbench.big_modeling.hooks.cpu_offload import cpu_offload_with_hook
from workbench.big_modeling.offload.folder import OffloadedWeightsLoader, offload_state_dict

META = torch.device("meta")


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)).eval()


def test_unknown_module_is_named() -> None:
    with pytest.raises(DeviceMapError, match=r"2 modules the model does not have: 3, decoder"):
        dispatch_model(mlp(), {"": "cpu", "decoder": "cpu", "3": "cpu"})


def test_uncovered_tensors_are_named_sorted() -> None:
    with pytest.raises(DeviceMapError, match=r"no device for 2 tensors: 2.bias, 2.weight"):
        dispatch_model(mlp(), {"0": "cpu"})


def test_bad_device_value() -> None:
    with pytest.raises(DeviceMapError, match="gpu0"):
        dispatch_model(mlp(), {"": "gpu0"})


def test_whole_model_on_disk_needs_an_offload_folder() -> None:
    # An all-disk map dispatches on the CPU (as in the reference), so only the folder is missing.
    with pytest.raises(DeviceMapError, match="offload_dir"):
        dispatch_model(mlp(), {"": "disk"})


def test_disk_without_folder_or_index() -> None:
    with pytest.raises(DeviceMapError, match="offload_dir"):
        dispatch_model(mlp(), {"0": "cpu", "2": "disk"})


def test_parameters_still_on_meta_are_named() -> None:
    model = mlp()
    model[2].to_empty(device="meta")
    with pytest.raises(CheckpointError, match=r"2 tensors .* meta device: 2.bias, 2.weight"):
        dispatch_model(copy.deepcopy(model), {"": "cpu"})
    with pytest.raises(CheckpointError, match=r"2.bias, 2.weight"):
        dispatch_model(copy.deepcopy(model), {"0": "cpu", "2": "cpu"}, force_hooks=True)


def test_meta_weights_on_disk_need_an_index(tmp_path: Path) -> None:
    model = mlp()
    model[2].to_empty(device="meta")
    with pytest.raises(CheckpointError, match=r"2.bias, 2.weight"):
        dispatch_model(model, {"0": "cpu", "2": "disk"}, offload_dir=tmp_path)
    assert not (tmp_path / "index.json").exists()


def test_main_device_is_the_first_accelerator_in_map_order() -> None:
    assert _main_device({"a": "cpu", "b": 1, "c": 0}, None) == 1
    assert _main_device({"a": "disk", "b": "cpu"}, None) == "cpu"
    assert _main_device({"a": 1}, "cuda:0") == 0


def test_main_device_cpu_runs_offloaded_blocks_on_cpu(tmp_path: Path) -> None:
    model = dispatch_model(mlp(), {"0": "cpu", "2": "disk"}, offload_dir=tmp_path)
    assert model._hf_hook.execution_device == "cpu"
    assert model[0].weight.device.type == "cpu"  # cpu blocks are not offloaded on a cpu main
    assert model[2].weight.device == META


def test_disk_buffers_come_from_the_folder_not_the_fresh_model(tmp_path: Path) -> None:
    """Accelerate serves a disk-mapped BatchNorm's *initial* stats; the stored ones are right."""
    torch.manual_seed(0)
    trained = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).eval()
    trained[1].running_mean.normal_()
    trained[1].running_var.uniform_(0.5, 2.0)
    x = torch.randn(3, 4)
    expected = trained(x)
    offload_state_dict(tmp_path, trained.state_dict())  # a folder made by an earlier load

    fresh = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).eval()
    fresh.load_state_dict(
        {k: v for k, v in trained.state_dict().items() if k.startswith("0.")}, strict=False
    )
    for module in (fresh[1], fresh[2]):
        for name, param in list(module.named_parameters(recurse=False)):
            setattr(module, name, nn.Parameter(param.detach().to("meta")))
    assert fresh[1].running_mean.abs().sum() == 0  # init values, as after init_empty_weights
    dispatched = dispatch_model(fresh, {"0": "cpu", "1": "disk", "2": "disk"}, offload_dir=tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(dispatched(x), expected, rtol=0, atol=0)


def test_offload_index_is_used_as_given(tmp_path: Path) -> None:
    model = mlp()
    x = torch.randn(2, 4)
    expected = model(x)
    index = offload_state_dict(
        tmp_path, {k: v for k, v in model.state_dict().items() if k.startswith("2.")}
    )
    model[2].to_empty(device="meta")
    dispatched = dispatch_model(
        model, {"0": "cpu", "2": "disk"}, offload_dir=tmp_path, offload_index=index
    )
    torch.testing.assert_close(dispatched(x), expected, rtol=0, atol=0)


class TiedHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.embed(ids))


def test_tied_weights_stay_tied_after_dispatch() -> None:
    model = dispatch_model(TiedHead(), {"embed": "cpu", "head": "cpu"}, force_hooks=True)
    assert model.head.weight is model.embed.weight


def test_tied_weight_on_disk_reuses_the_placed_copy(tmp_path: Path, monkeypatch) -> None:
    torch.manual_seed(0)
    model = TiedHead()
    ids = torch.tensor([[1, 2, 3]])
    expected = model(ids)
    reads: list[str] = []
    original = OffloadedWeightsLoader.__getitem__

    def counting(self, key):
        reads.append(key)
        return original(self, key)

    monkeypatch.setattr(OffloadedWeightsLoader, "__getitem__", counting)
    dispatched = dispatch_model(model, {"embed": "cpu", "head": "disk"}, offload_dir=tmp_path)
    torch.testing.assert_close(dispatched(ids), expected, rtol=0, atol=0)
    assert "head.weight" not in reads  # materialised once on cpu: the embedding's tensor


def test_exception_mid_model_leaves_every_offloaded_weight_on_meta(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 3), nn.Linear(5, 2))  # shape bug at 2
    dispatch_model(model, {"0": "disk", "1": "disk", "2": "disk", "": "cpu"}, offload_dir=tmp_path)
    with pytest.raises(RuntimeError):
        model(torch.ones(1, 4))
    assert all(p.device == META for p in model.parameters())
    assert model._hf_hook._input_devices == []


def test_disk_offload_of_a_meta_model_without_index_is_refused(tmp_path: Path) -> None:
    model = mlp().to_empty(device="meta")
    with pytest.raises(CheckpointError, match=r"0\.bias, 0\.weight, 2\.bias, 2\.weight"):
        disk_offload(model, tmp_path)


def test_cpu_offload_with_hook_chains_a_pipeline() -> None:
    first, second = mlp(), mlp()
    x = torch.randn(2, 4)
    expected = second(first(x))
    first, hook1 = cpu_offload_with_hook(first, "cpu")
    second, hook2 = cpu_offload_with_hook(second, "cpu", prev_module_hook=hook1)
    assert not hook1.hook.on_device
    y = first(x)
    assert hook1.hook.on_device
    torch.testing.assert_close(second(y), expected, rtol=0, atol=0)
    assert not hook1.hook.on_device and hook2.hook.on_device  # first offloaded before second ran
    hook2.offload()
    assert not hook2.hook.on_device
    hook2.remove()
    assert "forward" not in second.__dict__
    torch.testing.assert_close(second(y), expected, rtol=0, atol=0)
