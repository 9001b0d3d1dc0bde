"""estimate_activation_reserve: KV cache plus the largest activation, from real configs."""

from __future__ import annotations

import pytest
import torch

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.planning.activation_reserve import estimate_activation_reserve
from workbench.big_modeling.planning.planner import plan_device_map


def test_llama_reserve_golden(llama_config) -> None:
    # layers 2, hidden 64, heads 4 -> head_dim 16, kv heads 2, intermediate 128, vocab 128
    # kv: 2 * 2 layers * 1 * 32 tokens * 2 kv heads * 16 * 2 B = 8192 B
    # largest: max(32 * 2 * 128 * 2 = 16384, 1 * 4 * 32 * 32 * 2 = 8192, 32 * 128 * 4 = 16384)
    assert estimate_activation_reserve(llama_config, batch_size=1, seq_len=32) == 8192 + 16384


def test_gpt2_reserve_uses_its_spelling(gpt2_config) -> None:
    # n_layer 2, n_embd 32, n_head 4 (no GQA: 4 kv heads of 8), n_inner None -> 4 * 32 = 128
    # kv: 2 * 2 * 2 batch * 16 * 4 * 8 * 4 B (float32) = 16384 B
    # largest: max(32 * 2 * 128 * 4 = 32768, 2 * 4 * 16 * 16 * 4 = 8192, 32 * 96 * 4 = 12288)
    reserve = estimate_activation_reserve(gpt2_config, 2, 16, dtype=torch.float32)
    assert reserve == 16384 + 32768


def test_reserve_grows_with_context(llama_config) -> None:
    short = estimate_activation_reserve(llama_config, 1, 128, dtype="bfloat16")
    long = estimate_activation_reserve(llama_config, 1, 4096, dtype="bfloat16")
    assert long > 32 * short / 2  # KV is linear, eager scores quadratic


def test_reserve_feeds_the_planner(tiny_llama, llama_config) -> None:
    reserve = estimate_activation_reserve(llama_config, 1, 256)
    budgets = {0: "700KiB", "cpu": "1GiB"}  # model: 321 KiB, reserve: 576 KiB
    plain = plan_device_map(tiny_llama, max_memory=budgets, strategy="sequential")
    reserved = plan_device_map(
        tiny_llama, max_memory=budgets, strategy="sequential", reserve={0: reserve}
    )
    assert reserved.per_device_bytes.get(0, 0) + reserve <= 700 * 2**10
    assert reserved.per_device_bytes.get(0, 0) < plain.per_device_bytes.get(0, 0)


def test_bad_inputs(llama_config) -> None:
    with pytest.raises(BadInputError, match="positive"):
        estimate_activation_reserve(llama_config, 0, 10)

    class NotAModelConfig:
        hidden_size = 8

    with pytest.raises(BadInputError, match="no layer count, heads"):
        estimate_activation_reserve(NotAModelConfig(), 1, 10)
