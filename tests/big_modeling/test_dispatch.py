"""dispatch_model / cpu_offload / disk_offload give bit-identical outputs for every test model."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from workbench.big_modeling.dispatch import cpu_offload, disk_offload, dispatch_model
from workbench.big_modeling.hooks.base import remove_hook_from_submodules


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):  # (B, T, C)
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.mlp(x)


class TinyGPT(nn.Module):
    """A two-block transformer whose output head is tied to the token embedding."""

    def __init__(self, vocab: int = 40, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([Block(dim), Block(dim)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def make_mlp() -> tuple[nn.Module, torch.Tensor, dict]:
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(4)])
    device_map = {"0": "cpu", "1": "disk", "2": "cpu", "3": "disk"}
    return model, torch.randn(3, 16), device_map


def make_gpt() -> tuple[nn.Module, torch.Tensor, dict]:
    device_map = {
        "embed": "cpu",
        "blocks.0": "disk",
        "blocks.1": "cpu",
        "ln_f": "disk",
        "lm_head": "disk",
    }
    return TinyGPT(), torch.randint(0, 40, (2, 5)), device_map


def make_batchnorm() -> tuple[nn.Module, torch.Tensor, dict]:
    model = nn.Sequential(
        nn.Conv1d(3, 8, 3), nn.BatchNorm1d(8), nn.ReLU(), nn.Conv1d(8, 4, 3), nn.BatchNorm1d(4)
    )
    for bn in (model[1], model[4]):  # running stats far from their init values
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
        bn.num_batches_tracked.fill_(7)
    device_map = {"0": "cpu", "1": "disk", "2": "cpu", "3": "disk", "4": "disk"}
    return model, torch.randn(2, 3, 10), device_map


def make_llama() -> tuple[nn.Module, torch.Tensor, dict]:
    from transformers import LlamaConfig, LlamaForCausalLM  # heavy: imported only where needed

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=96,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    device_map = {
        "model.embed_tokens": "cpu",
        "model.layers.0": "disk",
        "model.layers.1": "cpu",
        "model.norm": "disk",
        "model.rotary_emb": "cpu",
        "lm_head": "disk",
    }
    return model, torch.randint(0, 96, (2, 7)), device_map


MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor, dict]]] = {
    "mlp": make_mlp,
    "gpt_tied": make_gpt,
    "batchnorm": make_batchnorm,
    "llama": make_llama,
}


def run(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(x)
    return out.logits if hasattr(out, "logits") else out


@pytest.fixture(params=sorted(MODELS))
def case(request):
    torch.manual_seed(0)
    model, x, device_map = MODELS[request.param]()
    model.eval()
    return model, x, device_map, run(model, x)


def test_dispatch_mixing_cpu_and_disk_is_exact(case, tmp_path: Path) -> None:
    model, x, device_map, expected = case
    dispatched = dispatch_model(copy.deepcopy(model), device_map, offload_dir=tmp_path)
    assert dispatched.hf_device_map == device_map
    assert (tmp_path / "index.json").is_file()
    torch.testing.assert_close(run(dispatched, x), expected, rtol=0, atol=0)
    torch.testing.assert_close(run(dispatched, x), expected, rtol=0, atol=0)  # twice: reloads


def test_cpu_offload_is_exact(case) -> None:
    model, x, _, expected = case
    offloaded = cpu_offload(copy.deepcopy(model), execution_device="cpu")
    assert all(p.device.type == "meta" for p in offloaded.parameters())
    torch.testing.assert_close(run(offloaded, x), expected, rtol=0, atol=0)


def test_disk_offload_is_exact(case, tmp_path: Path) -> None:
    model, x, _, expected = case
    offloaded = disk_offload(copy.deepcopy(model), tmp_path, execution_device="cpu")
    torch.testing.assert_close(run(offloaded, x), expected, rtol=0, atol=0)
    # a second model reuses the folder as it is (the index exists): still exact
    again = disk_offload(copy.deepcopy(model), tmp_path, execution_device="cpu")
    torch.testing.assert_close(run(again, x), expected, rtol=0, atol=0)


def test_force_hooks_on_one_device_then_remove(case) -> None:
    model, x, _, expected = case
    dispatched = dispatch_model(copy.deepcopy(model), {"": "cpu"}, force_hooks=True)
    assert "_hf_hook" in dispatched.__dict__
    torch.testing.assert_close(run(dispatched, x), expected, rtol=0, atol=0)
    remove_hook_from_submodules(dispatched)
    assert not any("forward" in m.__dict__ for m in dispatched.modules())
    torch.testing.assert_close(run(dispatched, x), expected, rtol=0, atol=0)


def test_transformers_generate_with_cache_on_a_dispatched_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, ids, device_map = make_llama()
    model.eval()
    ids = ids[:1]
    expected = model.generate(ids, max_new_tokens=4, do_sample=False)
    dispatched = dispatch_model(
        copy.deepcopy(model), device_map, offload_dir=tmp_path, skip_keys="past_key_values"
    )
    assert torch.equal(dispatched.generate(ids, max_new_tokens=4, do_sample=False), expected)
