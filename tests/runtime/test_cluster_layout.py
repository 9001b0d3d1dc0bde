"""The model as the cluster planner sees it: the per-layer KV cache from the memory model
(MLA latent whole on every TP rank, GQA heads split, sliding layers capped), mixture-of-experts
reads, and the DeepSeek-V3 plan on 2 x 8 x H100 that follows from them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from workbench.models.cluster import load_cluster
from workbench.models.intake import open_model
from workbench.runtime.cluster_layout import ModelLayout
from workbench.runtime.cluster_plan import plan_cluster

GIB = 2**30


@pytest.fixture(scope="module")
def deepseek_v3() -> ModelLayout:
    return ModelLayout.from_opened(open_model("deepseek-v3", dtype="fp8"))


@pytest.fixture(scope="module")
def llama_405b() -> ModelLayout:
    return ModelLayout.from_opened(open_model("llama-3.1-405b"))


def test_mla_caches_the_latent_whole_on_every_tp_rank(deepseek_v3: ModelLayout):
    # 1000 tokens * (kv_lora_rank 512 + qk_rope_head_dim 64) * 2 B (bf16) = 1,152,000 B per
    # layer; the latent has no heads to split, so TP 8 keeps the same bytes per GPU.
    assert {layer.kind for layer in deepseek_v3.attention.layers} == {"mla"}
    for tp in (1, 8):
        assert deepseek_v3.kv_cache_bytes(1, 1000, None, tp) == (1_152_000,) * 61
    # fp8 cache: 1 B per element
    fp8 = deepseek_v3.kv_cache_bytes(2, 1000, torch.float8_e4m3fn, 4)
    assert fp8 == (2 * 1000 * 576,) * 61


def test_fp8_weights_keep_activations_and_an_auto_cache_in_bf16(deepseek_v3: ModelLayout):
    assert deepseek_v3.weight_dtype == torch.float8_e4m3fn
    assert deepseek_v3.compute_dtype == torch.bfloat16


def test_gqa_heads_split_over_tp_and_replicate_past_the_kv_heads(llama_405b: ModelLayout):
    # 2 (K, V) * 1000 tokens * ceil(8 kv heads / tp) * 128 * 2 B: 1 head at TP 8 = 512,000 B;
    # TP 16 still keeps one whole head per rank; TP 4 two heads.
    per_layer = {tp: llama_405b.kv_cache_bytes(1, 1000, None, tp) for tp in (4, 8, 16)}
    assert per_layer[8] == per_layer[16] == (512_000,) * 126
    assert per_layer[4] == (1_024_000,) * 126
    assert per_layer[8][0] == llama_405b.kv_bytes_per_layer(1000, 2, 8)  # the dense figure


def test_sliding_layers_hold_their_window():
    # Mistral 7B: window 4096, 8 kv heads of 128: 4096 * 8 * (128 + 128) * 2 B = 16 MiB per
    # layer at any context beyond the window, a quarter of it per rank at TP 4.
    mistral = ModelLayout.from_opened(open_model("mistral-7b"))
    assert mistral.kv_cache_bytes(1, 32768, None, 1) == (16 * 2**20,) * 32
    assert mistral.kv_cache_bytes(1, 32768, None, 4) == (4 * 2**20,) * 32


def test_moe_blocks_hold_every_expert_but_a_token_reads_k_of_them(deepseek_v3: ModelLayout):
    assert (deepseek_v3.num_experts, deepseek_v3.experts_per_token) == (256, 8)
    # first_k_dense_replace = 3: layers 0-2 are dense, 3-60 carry 256 fused experts, in fp8
    # 256 * 3 * 7168 * 2048 B = 11,274,289,152 B (gate, up and down projections)
    assert deepseek_v3.layer_expert_nbytes[:4] == (0, 0, 0, 11_274_289_152)
    experts = deepseek_v3.layer_expert_nbytes[3]
    dense = deepseek_v3.layer_nbytes[3] - experts
    # one token: 8 / 256 of the experts; 2048 tokens touch them all (1 - (31/32)^2048 ~ 1)
    assert deepseek_v3.read_nbytes(3, 1) == pytest.approx(dense + experts * 8 / 256)
    assert deepseek_v3.read_nbytes(3, 2048) == pytest.approx(deepseek_v3.layer_nbytes[3])
    assert deepseek_v3.read_nbytes(0, 1) == deepseek_v3.layer_nbytes[0]  # dense layer: all
    expert_params = deepseek_v3.layer_expert_params[3]
    assert deepseek_v3.active_params(3) == pytest.approx(
        deepseek_v3.layer_params[3] - expert_params * (1 - 8 / 256)
    )


def test_deepseek_v3_fp8_plan_on_two_h100_nodes(deepseek_v3: ModelLayout):
    cluster = load_cluster("2x8-h100-80gb")
    plan = plan_cluster(deepseek_v3, cluster, engine="vllm", context_tokens=163840)
    best = plan.best
    assert best is not None
    assert sum(best.layer_partition) == 61
    for stage in best.stages:
        # 163840 tokens * 576 * 2 B = 188,743,680 B per layer on every GPU of the stage
        assert stage.kv_cache_bytes == stage.layer_count * 188_743_680
        assert stage.total_bytes <= stage.budget_bytes
    assert any(line.startswith("MLA: vllm caches the compressed latent") for line in plan.trace)
    assert any(line.startswith("MoE: 8 of 256") for line in plan.trace)
    # a decode token reads ~3% of the experts: faster than reading every expert would be
    dense_speed = plan_cluster(
        dataclasses.replace(deepseek_v3, num_experts=0),
        cluster,
        engine="vllm",
        context_tokens=163840,
        tp_sizes=(best.tp,),
    )
    same = next(c for c in dense_speed.candidates if c.pp == best.pp)
    assert best.decode_tokens_per_s > 3 * same.decode_tokens_per_s


def test_deepseek_v3_in_bf16_does_not_fit_two_h100_nodes():
    # 1,342 GB of bf16 weights > 16 GPUs * 0.95 * 80 GiB = 1,306 GB
    layout = ModelLayout.from_opened(open_model("deepseek-v3"))
    assert layout.total_nbytes > 16 * 0.95 * 80 * GIB
    plan = plan_cluster(layout, load_cluster("2x8-h100-80gb"), engine="vllm")
    assert plan.best is None
