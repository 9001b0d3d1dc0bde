"""The memory model in the one planning path: ``workbench plan --context ...``, the planner
panel's comparison and the lanes' figures (``device_reserves``) give the same numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers

from workbench.cli import main
from workbench.commands import plan as plan_command
from workbench.models.intake import open_model
from workbench.runtime import planning
from workbench.runtime.formatting import format_nbytes
from workbench.runtime.planning import (
    MemoryOptions,
    device_reserves,
    layer_cache_charges,
    plan_opened_model,
    planned_context,
)
from workbench.runtime.strategy_compare import PlanRequest, run_comparison

GIB = 2**30


def test_the_cli_the_comparison_and_the_lanes_agree(capsys: pytest.CaptureFixture[str]) -> None:
    opened = open_model("llama-3.1-8b")
    budgets: dict[int | str, int] = {0: 12 * GIB, 1: 12 * GIB, "cpu": 64 * GIB}
    assert main(["plan", "llama-3.1-8b", "--max-memory", "0=12GiB", "1=12GiB", "cpu=64GiB",
                 "--context", "16384", "--kv-dtype", "fp16", "--json"]) == 0  # fmt: skip
    from_cli = json.loads(capsys.readouterr().out)
    options = MemoryOptions(context=16384, kv_dtype="fp16")
    request = PlanRequest(
        model=opened.model,
        tree=opened.tree,
        profile=None,
        budgets=budgets,
        reserve={},
        dtype=None,
        no_split=list(opened.no_split_modules),
        strategies=("auto",),
        opened=opened,
        memory=options,
    )
    (candidate,) = run_comparison(request)
    plan = candidate.plan
    assert plan.device_map == from_cli["device_map"]
    assert {str(d): n for d, n in plan.reserve.items()} == from_cli["reserve"]
    lanes = device_reserves(opened, plan.device_map, options)  # what the lanes show
    assert {d: r.nbytes for d, r in lanes.items()} == plan.reserve
    assert from_cli["memory"] == {
        "batch": 1,
        "context": 16384,
        "context_cap": 32768,
        "kv_dtype": "fp16",
        "engine": "transformers",
        "prefill_tokens": 16384,  # no --prefill-tokens: one prefill of the whole context
    }
    # Llama 3.1 8B: 32 layers, GQA 8 of 32 heads of 128; each layer's cache: 16384 tokens * 8
    # heads * (128 + 128) * 2 B = 64 MiB. "auto" balances weights and caches: GPU 0 also holds
    # the embedding (1 GiB), so it gets 15 layers (960 MiB of cache), GPU 1 17 (1088 MiB).
    # Activation peak of a 16k prefill: residual 4 * 16384 * 4096 * 2 = 512 MiB + MLP
    # 3 * 16384 * 14336 * 2 = 1344 MiB = 1.81 GiB.
    peak = {str(d): format_nbytes(r.activation_nbytes) for d, r in lanes.items()}  # ~1.81 GiB
    assert from_cli["reserve_why"] == {
        "0": "layers 0-14 on cuda:0 need 960 MiB of KV cache at 16k context, fp16, GQA 8 of 32 "
        f"heads; activation peak {peak['0']} (MLP intermediate)",
        "1": "layers 15-31 on cuda:1 need 1.06 GiB of KV cache at 16k context, fp16, GQA 8 of 32 "
        f"heads; activation peak {peak['1']} (MLP intermediate)",
    }
    # (activation_peak's own figure may add small terms: the hand sum within 1%)
    assert {d: r.kv_nbytes for d, r in lanes.items()} == {0: 15 * 64 * 2**20, 1: 17 * 64 * 2**20}
    for reserve in lanes.values():
        assert reserve.activation_nbytes == pytest.approx(1856 * 2**20, rel=0.01)
    for device, nbytes in plan.per_device_bytes.items():
        assert nbytes + plan.reserve.get(device, 0) <= budgets[device]


def test_a_longer_context_moves_layers_off_the_gpu() -> None:
    opened = open_model("llama-3.1-8b")
    budgets = {0: 40 * GIB, "cpu": 64 * GIB}
    short = plan_opened_model(opened, max_memory=budgets, memory=MemoryOptions(context=4096))
    long = plan_opened_model(opened, max_memory=budgets, memory=MemoryOptions(context=131072))
    # 4k: 15 GiB of weights + 512 MiB of cache + 464 MiB of activations fit the 40 GiB GPU
    assert set(short.device_map.values()) == {0}
    assert short.reserve[0] == pytest.approx((512 + 464) * 2**20, rel=0.01)
    # 128k: the offloaded layers run on GPU 0, so every layer's cache stays there: 32 layers *
    # 131072 tokens * 8 * 256 * 2 B (bf16) = 16 GiB; a 128k prefill peaks at residual
    # 4 * 131072 * 4096 * 2 = 4 GiB + MLP 3 * 131072 * 14336 * 2 = 10.5 GiB
    assert long.reserve[0] == pytest.approx((16 + 14.5) * GIB, rel=0.01)
    peak = format_nbytes(long.reserve[0] - 16 * GIB)  # ~14.5 GiB
    assert long.reserve_why[0] == (
        "layers 0-31 on cuda:0 (layers 18-31 offloaded to cpu, run here) need 16 GiB of KV "
        f"cache at 128k context, bf16, GQA 8 of 32 heads; activation peak {peak} "
        "(MLP intermediate)"
    )
    assert long.per_device_bytes[0] + long.reserve[0] <= 40 * GIB


def test_the_default_context_is_the_model_maximum_capped(demo_dir: Path) -> None:
    big = open_model("llama-3.1-8b")  # max_position_embeddings 131072
    assert planned_context(big, MemoryOptions()) == 32768
    assert planned_context(big, MemoryOptions(context_cap=8192)) == 8192
    assert planned_context(big, MemoryOptions(context_cap=10**6)) == 131072
    demo = open_model(demo_dir)
    maximum = demo.config.max_position_embeddings
    assert planned_context(demo, MemoryOptions(context_cap=10**6)) == maximum


def test_charges_are_the_layers_caches(demo_dir: Path) -> None:
    opened = open_model(demo_dir)
    options = MemoryOptions(context=64)
    charges = layer_cache_charges(opened, options)
    (reserve,) = device_reserves(opened, {"": "cpu"}, options).values()
    assert sorted(charges) == [f"model.layers.{i}" for i in range(len(charges))]
    assert sum(charges.values()) == reserve.kv_nbytes


def test_unknown_attention_keys_are_named_in_the_cli_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    config.attention_window = 256  # a variant key the memory model does not know
    config.save_pretrained(tmp_path)
    source = str(tmp_path / "config.json")
    assert main(["plan", source, "--max-memory", "cpu=1GiB", "--context", "64"]) == 0
    out = capsys.readouterr().out
    assert "warning    " in out and "attention_window=256" in out
    assert main(["plan", source, "--max-memory", "cpu=1GiB", "--reserve", "auto", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert any("attention_window=256" in text for text in data["warnings"])
    assert data["reserve_why"]["cpu"].startswith("layers 0-1 on cpu need")


def test_bad_memory_options_are_errors() -> None:
    with pytest.raises(ValueError, match="context=0"):
        MemoryOptions(context=0)
    with pytest.raises(ValueError, match="unknown KV cache dtype 'fp4'"):
        MemoryOptions(kv_dtype="fp4")
    with pytest.raises(ValueError, match="unknown KV cache engine"):
        MemoryOptions(engine="llama.cpp")


def test_the_cli_offers_the_runtimes_kv_choices() -> None:
    assert plan_command.KV_DTYPES == planning.KV_DTYPES  # its parser needs them without torch
    assert plan_command.KV_ENGINES == planning.KV_ENGINES


def test_dense_copy_weights_reserve_their_largest_copy_where_they_run() -> None:
    opened = open_model("llama-3.1-8b")
    options = MemoryOptions(context=4096, kv_dtype="fp16")
    mlp = 14336 * 4096 * 2  # an MLP weight of Llama 3.1 8B in bf16: the largest 4-bit one
    for device_map, runner in (
        ({"": 0}, 0),
        ({"": "cpu"}, "cpu"),
        # offloaded layers run on the map's GPU, which keeps the one copy
        ({"model.embed_tokens": 0, "model.layers": "disk", "model.norm": 0,
          "model.rotary_emb": 0, "lm_head": 0}, 0),
    ):  # fmt: skip
        plain = device_reserves(opened, device_map, options)
        nf4 = device_reserves(opened, device_map, options, {"model.layers": "nf4"})
        assert nf4[runner].dequantize_nbytes == mlp
        assert nf4[runner].nbytes == plain[runner].nbytes + mlp
        assert (
            nf4[runner].why
            == plain[runner].why + "; 112 MiB to dequantize its largest nf4/fp4/int8 weight"
        )
    # torchao's int8 casts its weight for each matmul: the same MLP copy; a map's lm_head in
    # int8 (not kept in bf16 when named) copies the whole 128256 x 4096 head
    (int8,) = device_reserves(opened, {"": 0}, options, {"model.layers": "int8"}).values()
    assert int8.dequantize_nbytes == mlp
    head = {"lm_head": "int8", "model.layers": "bfloat16"}
    (reserve,) = device_reserves(opened, {"": 0}, options, head).values()
    assert reserve.dequantize_nbytes == 128256 * 4096 * 2
    # int4 runs tinygemm on the packed weight: no dense copy
    (int4,) = device_reserves(opened, {"": 0}, options, {"model.layers": "int4-g64"}).values()
    assert int4.dequantize_nbytes == 0
    # one layer in nf4: only its weights count (the same MLP size)
    (one,) = device_reserves(opened, {"": 0}, options, {"model.layers.3.mlp": "nf4"}).values()
    assert one.dequantize_nbytes == mlp
    (attention,) = device_reserves(
        opened, {"": 0}, options, {"model.layers.3.self_attn": "fp4"}
    ).values()
    assert attention.dequantize_nbytes == 4096 * 4096 * 2  # q_proj and o_proj, the largest
