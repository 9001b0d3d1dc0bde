"""dispatch_model with overlapping keys, planner maps and maps that skip non-persistent buffers.

The most specific key wins (as in transformers): ``{"": "cpu", "layers.1": "disk"}`` runs
``layers.1`` from disk and everything else on the CPU. Every test compares against the plain
model with zero tolerance (the CPU math is identical).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.big_modeling.dispatch import dispatch_model
from workbench.big_modeling.empty_init import init_empty_weights
from workbench.big_modeling.errors import DeviceMapError
from workbench.big_modeling.hooks.align import has_offloaded_params
from workbench.big_modeling.hooks.base import remove_hook_from_submodules
from workbench.big_modeling.loading.api import load_checkpoint_and_dispatch
from workbench.big_modeling.loading.writer import save_sharded_checkpoint
from workbench.big_modeling.offload.folder import offload_state_dict
from workbench.big_modeling.planning.planner import infer_auto_device_map, plan_device_map
from workbench.big_modeling.planning.sizes import compute_module_sizes


class Layer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("shift", torch.randn(dim))  # persistent, must be served

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C)
        return x + torch.tanh(self.proj(self.norm(x))) + self.shift


class Net(nn.Module):
    """Root-level parameter and buffer, three layers, a head: every key depth is exercised."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.register_buffer("offset", torch.randn(dim))
        self.embed = nn.Linear(dim, dim)
        self.layers = nn.ModuleList(Layer(dim) for _ in range(3))
        self.head = nn.Linear(dim, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x * self.scale + self.offset)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _net() -> tuple[Net, Net, torch.Tensor]:
    torch.manual_seed(0)
    model = Net().eval()
    return model, copy.deepcopy(model), torch.randn(3, 8)


def _to_meta(model: nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """Move the tensors under ``prefix`` to ``meta``; return their values (full names)."""
    values = {}
    for name, tensor in model.state_dict().items():
        if name.startswith(prefix + "."):
            values[name] = tensor.clone()
    module = model.get_submodule(prefix)
    module.to_empty(device="meta")
    return values


OVERLAPPING_MAPS = {
    "root_plus_disk": {"": "cpu", "layers.1": "disk"},
    "root_plus_cpu": {"": "cpu", "layers.0": "cpu", "head": "cpu", "layers.2": "disk"},
    "nested_override": {"": "cpu", "layers": "disk", "layers.1": "cpu"},
    "deep_override": {"": "disk", "layers.1": "cpu", "layers.1.proj": "disk"},
}


@pytest.mark.parametrize("device_map", OVERLAPPING_MAPS.values(), ids=OVERLAPPING_MAPS.keys())
def test_most_specific_key_wins_and_outputs_are_exact(device_map: dict, tmp_path: Path) -> None:
    model, reference, x = _net()
    dispatch_model(model, device_map, offload_dir=tmp_path / "offload")
    expected = reference(x)
    for _ in range(2):
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    assert model.hf_device_map == device_map


def test_root_plus_disk_key_with_disk_weights_already_on_meta(tmp_path: Path) -> None:
    """The reported bug: the root hook tried to place ``layers.1``, still on ``meta``."""
    model, reference, x = _net()
    offload_state_dict(tmp_path, _to_meta(model, "layers.1"))
    dispatch_model(model, {"": "cpu", "layers.1": "disk"}, offload_dir=tmp_path)
    torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)
    assert model.layers[1].proj.weight.device.type == "meta"  # served per forward
    assert has_offloaded_params(model.layers[1].proj)
    assert not has_offloaded_params(model)
    assert model.scale.device.type == "cpu"  # the root's own tensors stay with the root


def test_root_hook_handles_only_its_direct_tensors(tmp_path: Path) -> None:
    model, _, _ = _net()
    dispatch_model(model, {"": "cpu", "layers.1": "disk"}, offload_dir=tmp_path)
    root_hook = model._hf_hook
    assert not root_hook.place_submodules
    assert root_hook.io_same_device
    layer_hook = model.layers[1].proj._hf_hook
    assert layer_hook.offload and [slot.name for slot in layer_hook.slots] == ["weight", "bias"]


def test_nested_override_keeps_the_inner_block_off_disk(tmp_path: Path) -> None:
    model, reference, x = _net()
    dispatch_model(model, {"": "cpu", "layers": "disk", "layers.1": "cpu"}, offload_dir=tmp_path)
    index = (tmp_path / "index.json").read_text()
    assert "layers.0.proj.weight" in index and "layers.2.proj.weight" in index
    assert "layers.1." not in index  # only the disk blocks were written
    assert not has_offloaded_params(model.layers[1].proj)
    assert has_offloaded_params(model.layers[0].proj)
    torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)


def test_overlapping_map_round_trips_through_hook_removal(tmp_path: Path) -> None:
    model, reference, x = _net()
    dispatch_model(model, {"": "cpu", "layers.0": "cpu"}, force_hooks=True)
    torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)
    remove_hook_from_submodules(model)
    assert "_hf_hook" not in model.__dict__
    torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)


def test_overlapping_map_through_load_checkpoint_and_dispatch(tmp_path: Path) -> None:
    """The loading helper's path: weights come from a checkpoint, disk blocks stay on meta."""
    _, reference, x = _net()
    save_sharded_checkpoint(reference.state_dict(), tmp_path / "ckpt", num_shards=2)
    with init_empty_weights():
        model = Net()
    device_map = {"": "cpu", "layers": "disk", "layers.1": "cpu"}
    load_checkpoint_and_dispatch(
        model, tmp_path / "ckpt", device_map=device_map, offload_folder=tmp_path / "offload"
    )
    assert model.layers[0].proj.weight.device.type == "meta"
    assert model.layers[1].proj.weight.device.type == "cpu"
    torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)


# -- maps that do not name non-persistent buffers ---------------------------------------------


class Rotary(nn.Module):
    """Holds only a non-persistent buffer, like transformers' rotary embeddings."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("inv_freq", torch.rand(dim), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.cos(self.inv_freq)


class RotaryNet(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Linear(dim, dim)
        self.rotary = Rotary(dim)
        self.head = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rotary(self.embed(x)))


def test_map_missing_only_a_non_persistent_buffer_dispatches(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = RotaryNet()
    reference, x = copy.deepcopy(model), torch.randn(2, 8)
    inv_freq = model.rotary.inv_freq
    dispatch_model(model, {"embed": "cpu", "head": "disk"}, offload_dir=tmp_path)
    assert model.rotary.inv_freq is inv_freq  # stays where it is (already on the main device)
    assert model.rotary._hf_hook.execution_device == "cpu"
    torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)
    assert model.hf_device_map == {"embed": "cpu", "head": "disk"}


def test_map_missing_a_persistent_tensor_still_raises(tmp_path: Path) -> None:
    model, _, _ = _net()
    device_map = {"embed": "cpu", "layers": "cpu", "head": "disk"}
    with pytest.raises(DeviceMapError, match=r"2 tensors: offset, scale\. Add a covering key"):
        dispatch_model(model, device_map, offload_dir=tmp_path)


def test_uncovered_non_persistent_buffer_on_meta_is_named(tmp_path: Path) -> None:
    model = RotaryNet()
    model.rotary.to_empty(device="meta")
    with pytest.raises(Exception, match=r"rotary\.inv_freq"):
        dispatch_model(model, {"embed": "cpu", "head": "disk"}, offload_dir=tmp_path)


# -- every map the planner makes for small transformers models --------------------------------


def _real(config) -> nn.Module:
    from transformers import AutoModelForCausalLM  # heavy: imported only where needed

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def _planner_maps(model: nn.Module) -> dict[str, dict]:
    """cpu + disk maps from both planner entry points.

    One byte short of the model's size, the CPU cannot hold it all, and it keeps room for the
    largest disk-offloaded layer (so about one decoder layer and more go to disk).
    """
    total_bytes = compute_module_sizes(model)[""]
    max_memory = {"cpu": total_bytes - 1, "disk": 10 * total_bytes}
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    maps = {
        f"infer_clean_{clean}": infer_auto_device_map(
            model, max_memory=max_memory, no_split_module_classes=no_split, clean_result=clean
        )
        for clean in (True, False)
    }
    maps["plan_sequential"] = plan_device_map(
        model, max_memory=max_memory, strategy="sequential", no_split_module_classes=no_split
    ).device_map
    return maps


@pytest.mark.parametrize("config_name", ["llama_config", "gpt2_config"])
def test_every_planner_map_dispatches_exactly(
    config_name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = request.getfixturevalue(config_name)
    ids = torch.randint(0, config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    reference = _real(config)
    with torch.no_grad():
        expected = reference(ids).logits
    for label, device_map in _planner_maps(reference).items():
        assert {"cpu", "disk"} <= set(device_map.values()), label
        model = copy.deepcopy(reference)
        dispatch_model(model, device_map, offload_dir=tmp_path / label)
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0, msg=label)


def test_transformers_map_without_rotary_key_dispatches(llama_config, tmp_path: Path) -> None:
    reference = _real(llama_config)
    ids = torch.randint(0, llama_config.vocab_size, (1, 5))
    model = _real(llama_config)
    non_persistent = [n for n, _ in model.named_buffers() if n not in model.state_dict()]
    assert non_persistent and all(n.startswith("model.rotary_emb.") for n in non_persistent)
    device_map = {
        "model.embed_tokens": "cpu",
        "model.layers.0": "disk",
        "model.layers.1": "cpu",
        "model.norm": "disk",
        "lm_head": "cpu",
    }
    dispatch_model(model, device_map, offload_dir=tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=0)


@pytest.mark.gpu
def test_overlapping_map_on_cuda(tmp_path: Path) -> None:
    model, reference, x = _net()
    device_map = {"": 0, "layers.0": "cpu", "layers.1": "disk", "layers.2.proj": "cpu"}
    dispatch_model(model, device_map, offload_dir=tmp_path)
    assert model.scale.device.type == "cuda" and model.layers[2].norm.weight.device.type == "cuda"
    assert model.layers[0].proj.weight.device.type == "meta"
    out = model(x)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, reference(x), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_uncovered_non_persistent_buffer_moves_to_cuda(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = RotaryNet()
    reference, x = copy.deepcopy(model), torch.randn(2, 8)
    dispatch_model(model, {"embed": 0, "head": "disk"}, offload_dir=tmp_path)
    assert model.rotary.inv_freq.device.type == "cuda"
    torch.testing.assert_close(model(x), reference(x), rtol=1e-5, atol=1e-5)
