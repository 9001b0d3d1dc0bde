"""The planner's lazy index must not change a single size, leaf, tie or plan.

``LazyModuleIndex`` sums the tree in bulk and numbers modules only where the planner opens
them; opened all the way down it must equal the eager ``ModuleIndex``. Anything a bulk sum
cannot say exactly (a shared module, an empty slot, a tensor held twice — tied parameters
included) falls back to the eager walk.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from test_planner_properties import planning_cases
from torch import nn

from workbench.big_modeling.empty_init import init_empty_weights
from workbench.big_modeling.planning.module_index import ModuleIndex
from workbench.big_modeling.planning.on_demand_index import LazyModuleIndex, build_planner_index
from workbench.big_modeling.planning.planner import get_balanced_memory, infer_auto_device_map

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


def open_everything(index: ModuleIndex) -> None:
    for position in range(len(index.modules)):
        index.expand(position)  # preorder: a parent is opened before its children


def assert_same_index(lazy: ModuleIndex, full: ModuleIndex) -> None:
    assert names(lazy) == names(full)
    assert lazy.sizes == full.sizes
    assert lazy.ends == full.ends
    assert lazy.parents == full.parents
    assert lazy.class_names == full.class_names
    assert lazy.tied_groups == full.tied_groups
    for position in range(len(full.modules)):
        assert lazy.modules[position] is full.modules[position]
        assert lazy.buffer_nbytes(position) == full.buffer_nbytes(position)
        assert lazy.tensors_of(position) == full.tensors_of(position)


@pytest.mark.parametrize("dtype", [None, torch.float16])
def test_lazy_index_opened_fully_equals_the_eager_one(dtype) -> None:
    model = llama_like()
    model.model.layers[1].mlp.register_buffer("steps", torch.zeros(3, dtype=torch.int64))
    full = ModuleIndex.build(model, dtype=dtype)
    lazy = build_planner_index(model, dtype, no_split={BLOCK})
    assert isinstance(lazy, LazyModuleIndex)
    # Before the planner looks: the root and its children only (model, lm_head).
    numbered = [p for p in range(len(lazy.modules)) if lazy.modules[p] is not None]
    assert numbered == [0, 1, full.ends[1]]
    assert lazy.sizes[0] == full.sizes[0]
    assert lazy.buffer_nbytes(0) == full.buffer_nbytes(0)
    assert lazy.leaf_stats() == full.leaf_stats()
    assert lazy.largest_block({BLOCK}) == full.largest_block({BLOCK}) > 0
    # The largest layer inside model (a whole decoder layer, not looked into) stands at 1.
    positions, layer_sizes = lazy.layer_points({BLOCK})
    assert positions == [1, full.ends[1]]
    assert layer_sizes[0] == full.largest_block({BLOCK})
    open_everything(lazy)
    assert_same_index(lazy, full)
    assert lazy.layer_points({BLOCK}) == full.layer_points({BLOCK})
    assert lazy.layer_points(set()) == (
        full.leaf_positions(),
        [full.sizes[p] for p in full.leaf_positions()],
    )


def shared_module(model: nn.Module) -> None:
    model.extra = model.model.layers[0].mlp  # the same module under a second name


def empty_slot(model: nn.Module) -> None:
    model.model.layers.append(None)  # type: ignore[arg-type]


def shared_buffer(model: nn.Module) -> None:
    model.model.layers[1].self_attn.register_buffer("inv_freq", model.model.rotary_emb.inv_freq)


def tied_embeddings(model: nn.Module) -> None:
    model.lm_head.weight = model.model.embed_tokens.weight


def tied_into_a_block(model: nn.Module) -> None:
    model.lm_head.weight = model.model.layers[2].mlp.down_proj.weight


@pytest.mark.parametrize(
    "odd", [shared_module, empty_slot, shared_buffer, tied_embeddings, tied_into_a_block]
)
def test_trees_a_sum_cannot_say_fall_back_to_the_eager_walk(odd) -> None:
    model = llama_like()
    odd(model)
    index = build_planner_index(model, no_split={BLOCK})
    assert type(index) is ModuleIndex
    full = ModuleIndex.build(model)
    assert index.sizes == full.sizes
    assert index.tied_groups == full.tied_groups


def test_special_dtypes_use_the_eager_walk() -> None:
    index = build_planner_index(llama_like(), special_dtypes={"lm_head.weight": torch.float32})
    assert type(index) is ModuleIndex


def assert_same_plans(model: nn.Module, budgets: dict, no_split: list[str] | None) -> None:
    """Lazy and eager index give the same maps (``module_sizes={}`` forces the eager one)."""
    for fallback in (False, True):
        options = {"no_split_module_classes": no_split, "fallback_allocation": fallback}
        lazy = infer_auto_device_map(model, budgets, **options)
        eager = infer_auto_device_map(model, budgets, module_sizes={}, **options)
        assert lazy == eager


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("budget", [9_000, 20_000, 40_000])
def test_plans_match_the_full_index(tie: bool, budget: int) -> None:
    """``module_sizes={}`` overrides nothing but makes the planner use the eager index."""
    model = llama_like(tie=tie)
    budgets = {0: budget, 1: budget, "cpu": 30_000}
    for no_split in ([BLOCK], None):
        assert_same_plans(model, budgets, no_split)
    balanced = get_balanced_memory(model, budgets, no_split_module_classes=[BLOCK])
    full_index = ModuleIndex.build(model)
    count, total = full_index.leaf_stats()
    margin = int(1.25 * max(full_index.largest_block({BLOCK}), total // count))
    assert balanced[0] == min(budget, full_index.sizes[0] // 2 + margin)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planning_cases())
def test_lazy_and_eager_plans_agree_on_random_trees(case: tuple[nn.Module, dict, bool]) -> None:
    model, budgets, no_split = case
    classes = ["NoSplitBlock"] if no_split else None
    assert_same_plans(model, budgets, classes)
    index = build_planner_index(model, no_split=set(classes or ()))
    full = ModuleIndex.build(model)
    assert isinstance(index, LazyModuleIndex) != bool(full.tied_groups)
    assert index.leaf_stats() == full.leaf_stats()
    open_everything(index)
    assert_same_index(index, full)
