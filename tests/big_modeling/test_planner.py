"""The planner on hand-computed golden maps (byte budgets, arithmetic in comments)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from workbench.big_modeling.device_map.coverage import check_device_map
from workbench.big_modeling.errors import BadInputError, MemoryBudgetError
from workbench.big_modeling.planning.planner import (
    get_balanced_memory,
    infer_auto_device_map,
    plan_device_map,
)

# ToyModel (conftest): embed 80 B, blocks.0-2 160 B each (two 80 B Linears), head 40 B = 600 B.
# "Room" below is the bytes a main device (GPU 0, and the CPU when there are GPUs) keeps for
# the largest layer still to place, unless everything left fits.


def test_no_split_blocks_golden(toy_model: nn.Module) -> None:
    # embed: 600 left > 400, room 160 (a block) -> 240 usable: 80 fits (used 80)
    # blocks (480): room 40 (head) -> 360: 80 + 480 > 360 -> split
    # blocks.0: room 160 -> 240: 80 + 160 = 240 fits (used 240)
    # blocks.1: room 160 -> 240: 240 + 160 > 240, no split -> cpu, where all 360 B left fit
    device_map = infer_auto_device_map(
        toy_model, {0: 400, "cpu": 1000}, no_split_module_classes=["ToyBlock"]
    )
    assert device_map == {
        "embed": 0,
        "blocks.0": 0,
        "blocks.1": "cpu",
        "blocks.2": "cpu",
        "head": "cpu",
    }
    check_device_map(toy_model, device_map)


def test_splitting_blocks_golden(toy_model: nn.Module) -> None:
    # As above until blocks.1, which may now be split:
    # blocks.1.linear1: room 80 -> 320: 240 + 80 = 320 fits
    # blocks.1.linear2: room 80 (blocks.2.linear1) -> 320: 320 + 80 > 320 -> cpu
    device_map = infer_auto_device_map(toy_model, {0: 400, "cpu": 1000})
    assert device_map == {
        "embed": 0,
        "blocks.0": 0,
        "blocks.1.linear1": 0,
        "blocks.1.linear2": "cpu",
        "blocks.2": "cpu",
        "head": "cpu",
    }


def test_two_gpus_cpu_and_disk_golden(toy_model: nn.Module) -> None:
    # embed -> 0 (room 160 -> 140 usable: 80 fits); blocks split (room 40 -> 260 < 560)
    # blocks.0: 80 + 160 > 140 -> GPU 1 (no room kept there): 160 <= 300
    # blocks.1: 160 + 160 > 300 -> cpu: 360 left > 200, room 160 -> 40 usable -> disk
    plan = plan_device_map(
        toy_model,
        max_memory={0: 300, 1: 300, "cpu": 200},
        strategy="sequential",
        no_split_module_classes=["ToyBlock"],
    )
    assert plan.device_map == {
        "embed": 0,
        "blocks.0": 1,
        "blocks.1": "disk",
        "blocks.2": "disk",
        "head": "disk",
    }
    assert plan.per_device_bytes == {0: 80, 1: 160, "disk": 360}


def test_everything_fits_keeps_no_room(toy_model: nn.Module) -> None:
    # 600 B on a 600 B GPU: nothing would be offloaded, so no room is kept.
    assert infer_auto_device_map(toy_model, {0: 600, "cpu": 10}) == {"": 0}
    assert infer_auto_device_map(toy_model, {"cpu": 600}) == {"": "cpu"}


def test_reserve_keeps_activation_room(toy_model: nn.Module) -> None:
    # Without reserve, 500 B: embed, blocks.0 on GPU 0 (240 <= 500 - 160); blocks.1 -> cpu.
    # With 200 B reserved: 300 usable; blocks.0: 80 + 160 > 300 - 160 -> cpu.
    plain = plan_device_map(
        toy_model,
        max_memory={0: 500, "cpu": 1000},
        strategy="sequential",
        no_split_module_classes=["ToyBlock"],
    )
    assert plain.device_map == {
        "embed": 0,
        "blocks.0": 0,
        "blocks.1": "cpu",
        "blocks.2": "cpu",
        "head": "cpu",
    }
    reserved = plan_device_map(
        toy_model,
        max_memory={0: 500, "cpu": 1000},
        strategy="sequential",
        no_split_module_classes=["ToyBlock"],
        reserve={"cuda:0": "200B"},
    )
    assert reserved.device_map == {"embed": 0, "blocks": "cpu", "head": "cpu"}
    reason = next(p.reason for p in reserved.trace if p.module == "blocks.0")
    assert reason.startswith("blocks.0 does not fit on cuda:0: 160 B needed")
    assert "after the 200 B reserve and 160 B kept for the largest offloaded layer" in reason
    assert reason.endswith("blocks.0 fits on cpu: 160 B needed, 1000 B left")


def test_trace_covers_every_decision(toy_model: nn.Module) -> None:
    plan = plan_device_map(toy_model, max_memory={0: 400, "cpu": 1000}, strategy="sequential")
    placed = [p for p in plan.trace if p.device is not None]
    split = [p for p in plan.trace if p.device is None]
    assert [p.module for p in split] == ["blocks", "blocks.1"]
    assert sum(p.nbytes for p in placed) == 600
    assert {p.device for p in placed} == {0, "cpu"}
    assert split[0].reason.startswith("split into its parts: blocks does not fit on cuda:0")


def test_verbose_logs_the_trace(toy_model: nn.Module, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="workbench.big_modeling.planning.planner"):
        infer_auto_device_map(toy_model, {0: 400, "cpu": 1000}, verbose=True)
    # embed: room kept for the largest later layer (an 80 B Linear): 400 - 80 = 320 B usable
    assert (
        "embed fits on cuda:0: 80 B needed, 320 B left after 80 B kept for the largest "
        "offloaded layer" in caplog.text
    )


def test_clean_result_false_keeps_every_placed_module(toy_model: nn.Module) -> None:
    device_map = infer_auto_device_map(toy_model, {"cpu": 1000}, clean_result=False)
    assert device_map == {"embed": "cpu", "blocks": "cpu", "head": "cpu"}


def test_special_dtypes_and_dtype(toy_model: nn.Module) -> None:
    # float16 halves everything: 300 B fits a 300 B GPU
    assert infer_auto_device_map(toy_model, {0: 300, "cpu": 1}, dtype=torch.float16) == {"": 0}
    # ...unless head.weight stays float32 (+16 B)
    device_map = infer_auto_device_map(
        toy_model,
        {0: 300, "cpu": 1000},
        dtype=torch.float16,
        special_dtypes={"head.weight": torch.float32},
    )
    assert device_map != {"": 0}


def test_module_sizes_override(toy_model: nn.Module) -> None:
    from workbench.big_modeling.planning.sizes import compute_module_sizes

    sizes = compute_module_sizes(toy_model)
    sizes = {name: nbytes * 2 for name, nbytes in sizes.items()}  # as if float64
    assert infer_auto_device_map(toy_model, {0: 600, "cpu": 1200}) == {"": 0}
    assert infer_auto_device_map(toy_model, {0: 600, "cpu": 1200}, module_sizes=sizes) != {"": 0}


def test_tied_weights_share_a_device(tiny_llama) -> None:
    from workbench.big_modeling.device_map.coverage import resolve_device_map
    from workbench.big_modeling.planning.sizes import compute_module_sizes

    total = compute_module_sizes(tiny_llama)[""]
    for gpu_nbytes in range(total // 10, total, total // 10):
        device_map = infer_auto_device_map(
            tiny_llama,
            {0: gpu_nbytes, "cpu": total // 3},
            no_split_module_classes=tiny_llama._no_split_modules,
            offload_buffers=True,  # only silences the buffer warning of the tightest budgets
        )
        resolved = resolve_device_map(tiny_llama, device_map)
        assert resolved["lm_head.weight"] == resolved["model.embed_tokens.weight"], device_map


def test_split_modules_keep_their_direct_buffers() -> None:
    class WithOwnBuffer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Linear(4, 4)
            self.second = nn.Linear(4, 4)
            self.register_buffer("scale", torch.ones(4))

    model = WithOwnBuffer()
    device_map = infer_auto_device_map(model, {0: 100, "cpu": 1000}, offload_buffers=True)
    check_device_map(model, device_map)
    assert "scale" in device_map or "" in device_map


def test_offloaded_buffers_warn_when_no_gpu_can_hold_them() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 4))
    # 0: 80 B; 1: 72 B, 40 B of them buffers (2 x 16 B running stats + 8 B counter); 2: 80 B.
    # A 30 B GPU holds nothing, so all goes to cpu and its 40 B of buffers fit no GPU.
    with pytest.warns(UserWarning, match="offload_buffers=True"):
        infer_auto_device_map(model, {0: 30, "cpu": 1000})
    infer_auto_device_map(model, {0: 30, "cpu": 1000}, offload_buffers=True)  # no warning


def test_fallback_allocation_fills_an_empty_device() -> None:
    model = nn.Sequential()
    model.add_module("big", nn.Linear(10, 10))  # 110 x 4 = 440 B
    model.add_module("small", nn.Linear(2, 2))  # 6 x 4 = 24 B
    model.add_module("big2", nn.Linear(10, 10))  # 440 B
    # big: 904 B left > 500, room 440 -> 60 usable: does not fit, cannot split -> cpu.
    plain = infer_auto_device_map(model, {0: 500, "cpu": 1000})
    assert plain == {"": "cpu"}
    # With fallback, GPU 0 is not left empty: limit 500 - max(440, 440) = 60 B, small fits.
    fallback = infer_auto_device_map(model, {0: 500, "cpu": 1000}, fallback_allocation=True)
    assert fallback == {"small": 0, "big": "cpu", "big2": "cpu"}


def test_limited_disk_that_overflows_is_an_error(toy_model: nn.Module) -> None:
    with pytest.raises(MemoryBudgetError, match="fits on no device"):
        infer_auto_device_map(toy_model, {"cpu": 100, "disk": 100})


def test_unknown_strategy_and_reserve_without_budget(toy_model: nn.Module) -> None:
    with pytest.raises(BadInputError, match="strategy"):
        plan_device_map(toy_model, max_memory={"cpu": 1}, strategy="greedy")  # type: ignore[arg-type]
    with pytest.raises(BadInputError, match="without a budget: 3"):
        plan_device_map(toy_model, max_memory={0: 10**6}, reserve={3: 10})


def test_balanced_strategies() -> None:
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(8)])  # 8 x 80 B = 640 B
    # per GPU: 640 / 2 + 1.25 x 80 (mean leaf) = 420; the last GPU keeps its budget
    assert get_balanced_memory(model, {0: 1000, 1: 1000, "cpu": 1000}) == {
        0: 420,
        1: 1000,
        "cpu": 1000,
    }
    balanced = plan_device_map(model, max_memory={0: 1000, 1: 1000}, strategy="balanced")
    # 420 usable minus 80 of room: 4 layers on GPU 0
    assert balanced.device_map == {"0": 0, "1": 0, "2": 0, "3": 0, "4": 1, "5": 1, "6": 1, "7": 1}
    sequential = plan_device_map(model, max_memory={0: 1000, 1: 1000}, strategy="sequential")
    assert sequential.device_map == {"": 0}
    low_zero = plan_device_map(model, max_memory={0: 1000, 1: 1000}, strategy="balanced_low_0")
    # GPU 1 (last) keeps 1000 B: everything fits there; GPU 0 gets max(0, 640 - 1000) = 0
    assert low_zero.device_map == {"": 1}


def test_what_if_planning_never_touches_cuda(tiny_llama, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cuda(*args: object, **kwargs: object) -> None:
        raise AssertionError("the planner must not query CUDA")

    monkeypatch.setattr(torch.cuda, "mem_get_info", no_cuda)
    monkeypatch.setattr(torch.cuda, "device_count", no_cuda)
    monkeypatch.setattr(torch.cuda, "is_available", no_cuda)
    plan = plan_device_map(
        tiny_llama,
        max_memory={0: "200KB", 1: "200KB", "cpu": "64GiB"},
        no_split_module_classes=["LlamaDecoderLayer"],
    )
    assert {0, 1} <= set(plan.per_device_bytes)
    check_device_map(tiny_llama, plan.device_map)


def test_transformers_models_get_valid_maps(tiny_llama, tiny_gpt2, tiny_bert) -> None:
    for model in (tiny_llama, tiny_gpt2, tiny_bert):
        from workbench.big_modeling.planning.sizes import compute_module_sizes

        total = compute_module_sizes(model)[""]
        device_map = infer_auto_device_map(
            model,
            {0: total // 3, 1: total // 3, "cpu": total // 4},
            no_split_module_classes=list(model._no_split_modules),
        )
        check_device_map(model, device_map)
        assert len(set(device_map.values())) >= 2
        for key in device_map:  # no-split blocks whole
            assert ".h.0." not in key and ".layers.0." not in key and ".layer.0." not in key
