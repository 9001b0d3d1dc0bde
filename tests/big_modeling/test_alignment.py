"""AlignDevicesHook and the attach walkers, on CPU (meta stands in for a second device)."""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from workbench.big_modeling.errors import CheckpointError, DeviceMapError
from workbench.big_modeling.hooks.align import (
    AlignDevicesHook,
    align_module_device,
    has_offloaded_params,
)
from workbench.big_modeling.hooks.attach import (
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
)
from workbench.big_modeling.hooks.base import add_hook_to_module, remove_hook_from_module
from workbench.big_modeling.hooks.io_moves import find_device, send_to_device
from workbench.big_modeling.offload.folder import OffloadedWeightsLoader, offload_state_dict
from workbench.big_modeling.transfers import recording_transfers

META = torch.device("meta")
Pair = collections.namedtuple("Pair", ["first", "second"])


@dataclasses.dataclass
class Batch:
    ids: torch.Tensor
    mask: torch.Tensor
    name: str = "batch"


class Movable:
    """Like transformers' BatchEncoding: not a tensor, but has ``to``."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device

    def to(self, device: torch.device) -> Movable:
        return Movable(device)


def test_send_to_device_rebuilds_nested_structures() -> None:
    from transformers.modeling_outputs import CausalLMOutput  # heavy: imported only where needed

    data = {
        "tuple": (torch.ones(1), 3),
        "list": [torch.ones(1), "text"],
        "pair": Pair(torch.ones(1), torch.ones(2)),
        "batch": Batch(torch.ones(1), torch.ones(1)),
        "output": CausalLMOutput(logits=torch.ones(2)),
        "movable": Movable(),
        "cache": torch.ones(1),
    }
    moved = send_to_device(data, META, skip_keys="cache")
    assert moved["tuple"][0].device == META and moved["tuple"][1] == 3
    assert moved["list"][0].device == META and moved["list"][1] == "text"
    assert isinstance(moved["pair"], Pair) and moved["pair"].second.device == META
    assert isinstance(moved["batch"], Batch) and moved["batch"].mask.device == META
    assert moved["batch"].name == "batch"
    assert isinstance(moved["output"], CausalLMOutput) and moved["output"].logits.device == META
    assert moved["movable"].device == META
    assert moved["cache"].device.type == "cpu"  # skipped key stays put
    assert data["tuple"][0].device.type == "cpu"  # input untouched


def test_send_to_device_returns_tensors_already_there_unchanged() -> None:
    x = torch.ones(2)
    assert send_to_device(x, torch.device("cpu")) is x
    assert find_device([1, {"a": (None, x)}]) == torch.device("cpu")
    assert find_device(["no tensors"]) is None


class Probe(nn.Module):
    def forward(self, x, cache=None):
        return x.device, None if cache is None else cache.device


def test_inputs_move_and_skip_keys_are_honoured() -> None:
    module = add_hook_to_module(Probe(), AlignDevicesHook(META, skip_keys=["cache"]))
    assert module(torch.ones(1), cache=torch.ones(1)) == (META, torch.device("cpu"))
    plain = add_hook_to_module(Probe(), AlignDevicesHook(META))
    assert plain(torch.ones(1), cache=torch.ones(1)) == (META, META)


def test_disk_is_not_an_execution_device() -> None:
    with pytest.raises(DeviceMapError, match="disk"):
        AlignDevicesHook("disk")


class RecordingLinear(nn.Linear):
    """A Linear that records the data pointer of its weight during each forward."""

    def forward(self, x):
        self.seen.append(self.weight.data_ptr())
        return super().forward(x)


def test_offload_materialises_weights_only_during_the_forward_zero_copy() -> None:
    torch.manual_seed(0)
    layer = RecordingLinear(4, 4)
    x = torch.randn(2, 4)
    layer.seen = []
    expected = layer(x)
    state = {name: t.detach().clone() for name, t in layer.state_dict().items()}
    add_hook_to_module(layer, AlignDevicesHook("cpu", offload=True, weights_map=state))
    assert layer.weight.device == META and has_offloaded_params(layer)
    layer.seen = []
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)
    assert layer.seen == [state["weight"].data_ptr()]  # the CPU copy itself, no copy made
    assert layer.weight.device == META
    assert layer.weight.requires_grad


def test_exception_in_forward_puts_weights_back_to_meta() -> None:
    class Failing(nn.Linear):
        fail = True

        def forward(self, x):
            if self.fail:
                raise RuntimeError("kernel failed")
            return super().forward(x)

    layer = Failing(4, 4)
    add_hook_to_module(layer, AlignDevicesHook("cpu", offload=True))
    with pytest.raises(RuntimeError, match="kernel failed"):
        layer(torch.ones(1, 4))
    assert layer.weight.device == META and layer.bias.device == META
    layer.fail = False
    assert layer(torch.ones(1, 4)).shape == (1, 4)  # usable afterwards
    assert layer.weight.device == META


def test_detach_restores_the_original_weights() -> None:
    layer = nn.Linear(4, 4)
    before = layer.weight.detach().clone()
    add_hook_to_module(layer, AlignDevicesHook("cpu", offload=True))
    remove_hook_from_module(layer)
    assert layer.weight.device.type == "cpu" and isinstance(layer.weight, nn.Parameter)
    torch.testing.assert_close(layer.weight.detach(), before, rtol=0, atol=0)
    assert "forward" not in layer.__dict__


def test_missing_weights_are_named() -> None:
    layer = nn.Linear(4, 4)
    with pytest.raises(CheckpointError, match=r"lacks 1 tensors: bias"):
        add_hook_to_module(
            layer, AlignDevicesHook("cpu", offload=True, weights_map={"weight": layer.weight})
        )


class UsesChildWeight(nn.Module):
    """Reads its child's weight without calling the child (needs preload_module_classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        return F.linear(x, self.inner.weight, self.inner.bias)


def test_preload_module_classes_loads_children_weights() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(UsesChildWeight(), nn.ReLU())
    x = torch.randn(2, 4)
    expected = model(x)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    attach_align_device_hook(
        model, "cpu", offload=True, weights_map=state, preload_module_classes=["UsesChildWeight"]
    )
    assert "_hf_hook" not in model[0].inner.__dict__  # children are loaded by the parent
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    assert model[0].inner.weight.device == META


def test_without_preload_the_child_weight_is_meta_in_the_parent_forward() -> None:
    model = UsesChildWeight()
    seen = []
    model.register_forward_pre_hook(lambda m, a: seen.append(m.inner.weight.device))
    attach_align_device_hook(model, "cpu", offload=True)
    with pytest.raises(RuntimeError, match="meta"):
        model(torch.ones(1, 4))
    assert seen == [META]


def make_bn_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).eval()
    model[1].running_mean.normal_()
    model[1].running_var.uniform_(0.5, 2.0)
    return model


def test_persistent_buffers_are_served_from_the_weights_map(tmp_path: Path) -> None:
    """Accelerate keeps the module's *initial* BatchNorm stats here; we serve the stored ones."""
    trained = make_bn_model()
    x = torch.randn(3, 4)
    expected = trained(x)
    offload_state_dict(tmp_path, trained.state_dict())
    fresh = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).eval()  # stats: zeros and ones
    attach_align_device_hook(
        fresh, "cpu", offload=True, weights_map=OffloadedWeightsLoader(save_folder=tmp_path)
    )
    torch.testing.assert_close(fresh[1].running_mean, trained[1].running_mean, rtol=0, atol=0)
    torch.testing.assert_close(fresh(x), expected, rtol=0, atol=0)


def test_offload_buffers_keeps_buffers_meta_between_forwards() -> None:
    model = make_bn_model()
    x = torch.randn(3, 4)
    expected = model(x)
    attach_align_device_hook(model, "cpu", offload=True, offload_buffers=True)
    assert model[1].running_mean.device == META
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    assert model[1].running_mean.device == META


def test_tied_weight_materialised_once_per_device(tmp_path: Path) -> None:
    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4, bias=False)
            self.b = nn.Linear(4, 4, bias=False)
            self.b.weight = self.a.weight

        def forward(self, x):
            self.seen = (self.a.weight, self.b.weight)
            return self.b(self.a(x))

    torch.manual_seed(0)
    model = TwoHeads()
    x = torch.randn(2, 4)
    expected = model(x)
    offload_state_dict(tmp_path, model.state_dict())
    weights = OffloadedWeightsLoader(save_folder=tmp_path)  # a fresh mmap per read
    tied = {model.a.weight.data_ptr(): {}}
    attach_align_device_hook(
        model,
        "cpu",
        offload=True,
        weights_map=weights,
        preload_module_classes=["TwoHeads"],
        tied_params_map=tied,
    )
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    assert model.seen[0] is model.seen[1]  # one materialisation shared by both
    assert tied == {next(iter(tied)): {}}  # released after the forward


def test_reentrant_forward_keeps_weights_until_the_outer_call_ends() -> None:
    class Recursive(nn.Linear):
        def forward(self, x, depth=2):
            out = super().forward(x)
            return self.forward(out, depth - 1) if depth else out

    torch.manual_seed(0)
    layer = Recursive(4, 4)
    x = torch.randn(1, 4)
    expected = layer(x)
    add_hook_to_module(layer, AlignDevicesHook("cpu", offload=True))
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)
    assert layer.weight.device == META


def test_on_blocks_with_dict_devices_and_offload() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    x = torch.randn(2, 4)
    expected = model(x)
    attach_align_device_hook_on_blocks(
        model,
        execution_device={"": "cpu", "0": "cpu", "1": "cpu"},
        offload={"": False, "0": False, "1": True},
        weights_map={k: v.clone() for k, v in model.state_dict().items()},
    )
    assert not has_offloaded_params(model[0]) and has_offloaded_params(model[1][0])
    assert model._hf_hook.io_same_device
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)


def test_execution_device_hook_skips_stateless_modules_and_preload_children() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), UsesChildWeight())
    attach_execution_device_hook(model, "cpu", preload_module_classes=["UsesChildWeight"])
    hooked = sorted(name for name, m in model.named_modules() if "_hf_hook" in m.__dict__)
    assert hooked == ["", "0", "2"]


def test_align_module_device_for_offloaded_and_plain_modules() -> None:
    layer = nn.Linear(2, 2)
    add_hook_to_module(layer, AlignDevicesHook("cpu", offload=True))
    with align_module_device(layer):
        assert layer.weight.device.type == "cpu"
    assert layer.weight.device == META
    with align_module_device(layer, "meta"):
        assert layer.weight.device == META
    assert layer._hf_hook.execution_device == "cpu"
    plain = nn.Linear(2, 2)
    with align_module_device(plain, "meta"):
        assert plain.weight.device == META
    assert plain.weight.device.type == "cpu"


def test_transfer_events_name_module_bytes_and_source(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    offload_state_dict(tmp_path, {"1.weight": model[1].weight, "1.bias": model[1].bias})
    state = {"0.weight": model[0].weight.detach(), "0.bias": model[0].bias.detach()}
    weights = OffloadedWeightsLoader(state_dict=state, save_folder=tmp_path)
    attach_align_device_hook(model, "cpu", offload=True, weights_map=weights)
    events = []
    with recording_transfers(events.append):
        model(torch.ones(1, 4))
    transfers = [
        (e.module, e.nbytes, e.source, e.destination) for e in events if e.kind == "transfer"
    ]
    # (16 + 4) * 4 B = 80 B; (8 + 2) * 4 B = 40 B
    assert transfers == [("0", 80, "cpu", "cpu"), ("1", 40, "disk", "cpu")]
    computes = [e.module for e in events if e.kind == "compute"]
    assert computes == ["0", "1"]


def test_repr_describes_the_hook() -> None:
    layer = add_hook_to_module(nn.Linear(2, 2), AlignDevicesHook("cpu", offload=True))
    assert (
        repr(layer._hf_hook)
        == "AlignDevicesHook(execution_device='cpu', offload='2 tensors, 24 B')"
    )


def test_subclass_overriding_pre_forward_is_not_bypassed_by_the_fast_path() -> None:
    calls = []

    class Counting(AlignDevicesHook):
        def pre_forward(self, module, *args, **kwargs):
            calls.append(module)
            return super().pre_forward(module, *args, **kwargs)

    plain_hook = AlignDevicesHook("cpu")
    assert plain_hook.input_move is not None  # the plain hook takes the inlined path
    module = add_hook_to_module(Probe(), Counting("cpu"))
    assert module._hf_hook.input_move is None
    module(torch.ones(1))
    assert calls == [module]
