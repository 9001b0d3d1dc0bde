"""Speed shortcuts of the planner index must not change a single size, leaf or plan.

``ModuleIndex.build(..., collapse=no_split)`` sums the subtree of each no-split module instead
of numbering its modules (the planner never looks inside them); anything a sum cannot say
exactly (a shared module, an empty slot, a tensor held twice) falls back to the full walk.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench.big_modeling.empty_init import init_empty_weights
from workbench.big_modeling.planner import get_balanced_memory, infer_auto_device_map
from workbench.big_modeling.planner_index import ModuleIndex

BLOCK = "LlamaDecoderLayer"


def llama_like(tie: bool = False) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )
    with init_empty_weights():
        return LlamaForCausalLM(config)


def names(index: ModuleIndex) -> list[str]:
    return [index.name_of(position) for position in range(len(index.modules))]


@pytest.mark.parametrize("dtype", [None, torch.float16])
def test_collapsed_index_keeps_every_size(dtype) -> None:
    model = llama_like()
    model.model.layers[1].mlp.register_buffer("steps", torch.zeros(3, dtype=torch.int64))
    full = ModuleIndex.build(model, dtype=dtype)
    fast = ModuleIndex.build(model, dtype=dtype, collapse={BLOCK})
    assert len(fast._collapsed) == 3  # the three decoder layers are summed, not numbered
    assert len(fast.modules) < len(full.modules)
    full_sizes = dict(zip(names(full), full.sizes, strict=True))
    assert {name: full_sizes[name] for name in names(fast)} == dict(
        zip(names(fast), fast.sizes, strict=True)
    )
    assert fast.leaf_stats() == full.leaf_stats()
    for position, name in enumerate(names(fast)):
        assert fast.buffer_nbytes(position) == full.buffer_nbytes(names(full).index(name))
    layer = names(fast).index("model.layers.1")
    assert not fast.has_children(layer)
    assert fast.class_names[layer] == BLOCK


def test_tie_into_a_block_falls_back_to_the_full_walk() -> None:
    model = llama_like()
    model.lm_head.weight = model.model.layers[2].mlp.down_proj.weight  # same shape family
    index = ModuleIndex.build(model, collapse={BLOCK})
    assert not index._collapsed
    assert index.tied_groups  # the tie is seen, with both names
    assert "model.layers.2.mlp.down_proj" in names(index)


def test_module_shared_out_of_a_block_counts_once() -> None:
    """Met first inside a collapsed block, the module is skipped later, as named_modules does."""
    model = llama_like()
    model.extra = model.model.layers[0].mlp  # the same module under a second name, after
    index = ModuleIndex.build(model, collapse={BLOCK})
    assert len(index._collapsed) == 3
    assert "extra" not in names(index)
    assert index.sizes[0] == ModuleIndex.build(model).sizes[0]


def test_module_shared_into_a_block_falls_back_to_the_full_walk() -> None:
    model = llama_like()
    model.model.layers[2].mlp = model.model.embed_tokens  # met first before the block
    index = ModuleIndex.build(model, collapse={BLOCK})
    assert not index._collapsed
    assert index.sizes[0] == ModuleIndex.build(model).sizes[0]


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("budget", [9_000, 20_000, 40_000])
def test_plans_match_the_full_index(tie: bool, budget: int) -> None:
    """``module_sizes={}`` overrides nothing but turns collapsing off: maps must be equal."""
    model = llama_like(tie=tie)
    budgets = {0: budget, 1: budget, "cpu": 30_000}
    for no_split in ([BLOCK], None):
        fast = infer_auto_device_map(model, budgets, no_split_module_classes=no_split)
        full = infer_auto_device_map(
            model, budgets, no_split_module_classes=no_split, module_sizes={}
        )
        assert fast == full
    balanced = get_balanced_memory(model, budgets, no_split_module_classes=[BLOCK])
    full_index = ModuleIndex.build(model)
    nbytes = [full_index.sizes[p] for p in range(len(full_index.modules))]
    block = max(n for n, c in zip(nbytes, full_index.class_names, strict=True) if c == BLOCK)
    count, total = full_index.leaf_stats()
    margin = int(1.25 * max(block, total // count))
    assert balanced[0] == min(budget, full_index.sizes[0] // 2 + margin)
