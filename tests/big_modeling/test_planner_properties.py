"""Hypothesis properties of the planner on random module trees and budgets.

Every plan: covers each tensor exactly once (no overlapping keys), keeps every non-disk device
within its budget, never splits a no-split block, keeps tied parameters together, and leaves
GPU 0 room for the largest layer offloaded to the CPU.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from workbench.big_modeling.device_map.coverage import resolve_device_map
from workbench.big_modeling.planning.planner import infer_auto_device_map
from workbench.big_modeling.planning.sizes import compute_module_sizes


class Container(nn.Module):
    """A module that may be split."""


class NoSplitBlock(nn.Module):
    """A module that must stay whole."""


leaf = st.tuples(st.just("linear"), st.integers(1, 6), st.integers(1, 6), st.booleans())
tree = st.recursive(
    leaf,
    lambda children: st.tuples(
        st.sampled_from(["container", "block"]), st.lists(children, min_size=1, max_size=4)
    ),
    max_leaves=12,
)


def build(spec: tuple) -> nn.Module:
    if spec[0] == "linear":
        _, fan_in, fan_out, bias = spec
        return nn.Linear(fan_in, fan_out, bias=bias)
    module = Container() if spec[0] == "container" else NoSplitBlock()
    for number, child in enumerate(spec[1]):
        module.add_module(f"c{number}", build(child))
    return module


@st.composite
def planning_cases(draw: st.DrawFn) -> tuple[nn.Module, dict, bool]:
    model = Container()
    model.add_module("embed", nn.Linear(3, 5, bias=False))
    model.add_module("body", build(draw(tree)))
    tied = draw(st.booleans())
    if tied:
        model.add_module("head", nn.Linear(3, 5, bias=False))
        model.head.weight = model.embed.weight
    total = compute_module_sizes(model)[""]
    budgets: dict = {}
    for gpu in range(draw(st.integers(0, 2))):
        budgets[gpu] = draw(st.integers(0, total))
    budgets["cpu"] = draw(st.integers(0, total))
    return model, budgets, draw(st.booleans())


def layers_of(model: nn.Module) -> dict[str, nn.Module]:
    """Modules without child modules or of the no-split class, not looked into."""
    result = {}
    stack = list(model.named_children())
    while stack:
        name, module = stack.pop()
        children = list(module.named_children())
        if not children or isinstance(module, NoSplitBlock):
            result[name] = module
        else:
            stack.extend((f"{name}.{child}", sub) for child, sub in children)
    return result


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planning_cases())
def test_every_plan_is_valid(case: tuple[nn.Module, dict, bool]) -> None:
    model, budgets, no_split = case
    device_map = infer_auto_device_map(
        model,
        budgets,
        no_split_module_classes=["NoSplitBlock"] if no_split else None,
        clean_result=True,
    )
    # Each tensor exactly once: resolvable, and no key lies inside another key.
    resolved = resolve_device_map(model, device_map)
    keys = sorted(device_map)
    for key in keys:
        for other in keys:
            assert other == key or not (key == "" or other.startswith(key + ".")), (key, other)

    sizes = compute_module_sizes(model)
    used: dict = {}
    for tensor_name, device in resolved.items():
        used[device] = used.get(device, 0) + sizes[tensor_name]
    for device, nbytes in used.items():
        if device != "disk":
            assert nbytes <= budgets[device], (device, nbytes, budgets, device_map)

    if no_split:
        blocks = [n for n, m in model.named_modules() if isinstance(m, NoSplitBlock)]
        for key in device_map:
            assert not any(key.startswith(block + ".") for block in blocks), (key, device_map)

    if hasattr(model, "head"):
        assert resolved["head.weight"] == resolved["embed.weight"]

    gpus = [device for device in budgets if isinstance(device, int)]
    if gpus and no_split:
        layers = layers_of(model)
        offloaded = [
            sizes[name]
            for name in layers
            if {resolved[t] for t in resolved if t.startswith(name + ".")} == {"cpu"}
        ]
        if offloaded:
            assert (
                used.get(gpus[0], 0) + max(offloaded) <= budgets[gpus[0]]
                or used.get(gpus[0], 0) == 0
            )


@settings(max_examples=40, deadline=None)
@given(planning_cases())
def test_module_sizes_match_a_naive_prefix_sum(case: tuple[nn.Module, dict, bool]) -> None:
    model = case[0]
    model.register_buffer("steps", torch.zeros(3, dtype=torch.int64))
    expected: dict[str, int] = {name: 0 for name, _ in model.named_modules()}
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        parts = name.split(".")
        for depth in range(len(parts) + 1):
            prefix = ".".join(parts[:depth])
            expected[prefix] = expected.get(prefix, 0) + nbytes
    sizes = compute_module_sizes(model)
    assert {name: sizes[name] for name in expected} == expected
    from workbench.big_modeling.planning.module_index import ModuleIndex

    index = ModuleIndex.build(model)
    assert index.buffer_nbytes(0) == 24
    for position in range(len(index.modules)):
        children = [index.name_of(child) for child in index.child_positions(position)]
        prefix = index.name_of(position)
        direct = [
            f"{prefix}.{child}" if prefix else child
            for child, _ in index.modules[position].named_children()
        ]
        assert children == direct
