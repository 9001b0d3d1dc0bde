"""``plan_precision_and_devices`` on a tiny block model with budgets in bytes and speed
functions simple enough to check by hand."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from workbench.big_modeling.device_map.value import device_for
from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.planning.precision_planner import (
    compact_layer_names,
    pareto_front,
    plan_precision_and_devices,
    sensitivity_order,
)
from workbench.big_modeling.quantization.sizes import QuantizableWeights, quantized_weight_nbytes


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(128, 128, bias=False)  # bf16: 128*128*2 = 32 KiB


class Stack(nn.Module):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(count))


LAYERS = [f"layers.{i}" for i in range(4)]
BF16 = 128 * 128 * 2  # 32768 B per layer
INT8 = quantized_weight_nbytes("int8", 128, 128, torch.bfloat16)  # 128*128 + 5*128 = 17024
INT4 = quantized_weight_nbytes("int4-g128", 128, 128, torch.bfloat16)  # 8192 + 2*1*128*2 = 8704


def stack() -> nn.Module:
    with torch.device("meta"):
        return Stack(4).to(torch.bfloat16)


def gpu_fast(device_map: Mapping[str, object], tensor_nbytes: Mapping[str, int]) -> float:
    """1 s per byte on GPU 0, 100 s per byte elsewhere: tokens/s = 1 / total seconds."""
    seconds = 0.0
    for tensor, nbytes in tensor_nbytes.items():
        layer = tensor.rpartition(".proj")[0]
        seconds += nbytes * (1 if device_for(layer, device_map) == 0 else 100)
    return 1 / seconds


def plan(max_memory: Mapping[object, int], score=gpu_fast, **kwargs):
    model = stack()
    base = {f"{layer}.proj.weight": BF16 for layer in LAYERS}
    return plan_precision_and_devices(
        model,
        max_memory=max_memory,
        precisions=kwargs.pop("precisions", ["int4", "int8", "bf16"]),
        layers=LAYERS,
        base_nbytes=base,
        weights=QuantizableWeights.of(model),
        param_count=4 * 128 * 128,
        score=score,
        no_split_module_classes=["Block"],
        strategy="sequential",
        **kwargs,
    )


def test_smaller_precision_wins_when_it_keeps_layers_on_the_gpu() -> None:
    # GPU 0 holds 4 x 8704 B of int4 (34816 B); int8 layers are 17024 B, and with layers
    # offloaded the reference keeps room for the largest one: 1 int8 layer on GPU 0
    result = plan({0: 4 * INT4, "cpu": 10**6})
    assert result.chosen.label == "int4-g128 everywhere"
    assert set(result.device_map.values()) == {0}
    assert result.per_device_bytes == {0: 4 * INT4}
    int8 = next(c for c in result.candidates if c.label == "int8 everywhere")
    assert int8.device_map["layers.1"] == "cpu" and int8.tokens_per_s < result.tokens_per_s
    assert any(
        line.startswith("int8 everywhere would put layers.1-3 on cpu") and "slower" in line
        for line in result.trace
    )
    assert result.average_bits == pytest.approx(8 * 4 * INT4 / (4 * 128 * 128))


def test_speed_ties_go_to_the_plan_with_more_bits() -> None:
    def compute_bound(device_map: Mapping[str, object], tensor_nbytes: Mapping[str, int]) -> float:
        return 10.0  # the same speed whatever the bytes: every candidate ties

    result = plan({0: 10**6, "cpu": 10**6}, score=compute_bound)
    assert result.chosen.label == "bfloat16 everywhere"
    assert result.average_bits == 16


def test_min_bits_forces_the_fewest_high_precision_layers() -> None:
    # int4 alone: 8 * 8704 / 16384 = 4.25 bits; each bf16 layer adds (32768 - 8704) * 8 / 65536
    # = 2.94 bits, so 8 bits need 2 bf16 layers (10.13) or 3 int8 layers with int4 (8.04 ...)
    result = plan({0: 10**6, "cpu": 10**6}, min_bits=8.0)
    assert result.average_bits >= 8.0
    assert result.chosen.feasible
    assert all(c.average_bits >= 8.0 for c in result.candidates if c.feasible)
    assert any(not c.feasible and "under the minimum 8" in c.problem for c in result.candidates)
    fastest = max(c.tokens_per_s for c in result.candidates if c.feasible)
    assert result.tokens_per_s >= 0.98 * fastest


def test_floors_keep_named_layers_at_or_above_their_precision() -> None:
    result = plan({0: 4 * INT4, "cpu": 10**6}, floors={"layers.0": "bf16", "layers.3": "int8"})
    assert result.chosen.layer_precisions[0] == "bfloat16"
    assert result.chosen.layer_precisions[3] in ("int8", "bfloat16")
    assert all(c.layer_precisions[0] == "bfloat16" for c in result.candidates)


def test_unknown_floor_and_impossible_bits_are_named() -> None:
    with pytest.raises(BadInputError, match=r"name no planned layer: decoder\.9"):
        plan({0: 10**6}, floors={"decoder.9": "int8"})
    with pytest.raises(BadInputError, match=r"no precision plan fits.*closest"):
        plan({0: 10**6, "cpu": 10**6}, min_bits=20.0)


def test_every_candidate_is_kept_with_its_maps() -> None:
    result = plan({0: 2 * INT8, "cpu": 10**6})
    labels = [c.label for c in result.candidates]
    assert len(labels) == len(set(labels)) >= 3
    for candidate in result.candidates:
        assert set(candidate.precision_map) == set(LAYERS)
        assert sum(candidate.per_device_bytes.values()) > 0
    assert result.chosen in result.candidates


def test_helpers() -> None:
    assert sensitivity_order(4) == [0, 3, 1, 2]
    assert compact_layer_names(["a.1", "a.2", "a.3", "b", "a.7"]) == "a.1-3, b, a.7"


def test_pareto_front_keeps_only_undominated_feasible_candidates() -> None:
    result = plan({0: 4 * INT4, "cpu": 10**6}, min_bits=5.0)
    front = pareto_front(result.candidates)
    assert front and all(c.feasible for c in front)
    for c in front:
        for other in result.candidates:
            if other.feasible and other is not c:
                better = (
                    other.fastest_device_bytes() <= c.fastest_device_bytes()
                    and other.tokens_per_s >= c.tokens_per_s
                    and other.average_bits >= c.average_bits
                )
                same = (
                    other.fastest_device_bytes() == c.fastest_device_bytes()
                    and other.tokens_per_s == c.tokens_per_s
                    and other.average_bits == c.average_bits
                )
                assert not better or same


@settings(max_examples=25, deadline=None)
@given(
    gpu_layers=st.floats(min_value=0.0, max_value=5.0),
    min_bits=st.one_of(st.none(), st.floats(min_value=4.0, max_value=15.0)),
)
def test_chosen_plan_is_feasible_and_fastest_within_tolerance(
    gpu_layers: float, min_bits: float | None
) -> None:
    budgets = {0: int(gpu_layers * BF16), "cpu": 10**6}
    result = plan(budgets, min_bits=min_bits)
    chosen = result.chosen
    assert chosen.feasible
    assert min_bits is None or chosen.average_bits >= min_bits - 1e-9
    assert chosen.per_device_bytes.get(0, 0) <= budgets[0]
    fastest = max(c.tokens_per_s for c in result.candidates if c.feasible)
    assert chosen.tokens_per_s >= 0.98 * fastest
    tied = [c for c in result.candidates if c.feasible and c.tokens_per_s >= 0.98 * fastest]
    assert chosen.average_bits == max(c.average_bits for c in tied)


def test_trace_says_why_a_faster_tie_lost() -> None:
    def nearly_flat(device_map: Mapping[str, object], tensor_nbytes: Mapping[str, int]) -> float:
        return 100.0 - sum(tensor_nbytes.values()) / 10**5  # 1 % between int4 and bf16

    result = plan({0: 10**6, "cpu": 10**6}, score=nearly_flat)
    assert result.chosen.label == "bfloat16 everywhere"
    assert any(
        line.startswith("int4-g128 everywhere:") and line.endswith("(a speed tie: fewer bits)")
        for line in result.trace
    )
