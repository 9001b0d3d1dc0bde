"""The reserve the planner keeps: ``estimate_activation_reserve`` (one device) and the memory
model's reserve per device (``reserve_for_map`` + ``charges`` of ``plan_device_map``).

Sizes of ``tiny_llama`` (float32, from ``llama_config``: hidden 64, 4 heads / 2 KV heads of 16,
intermediate 128, vocab 128, tied): embed 128 * 64 * 4 = 32768 B; each decoder layer
q 64*64 + k 64*32 + v 64*32 + o 64*64 = 12288, MLP 3 * 64 * 128 = 24576, two norms 128
-> 36992 params * 4 B = 147968 B; norm 256 B; rotary inv_freq 64 B (a buffer).
Its cache at 256 tokens, float32: 1 * 256 * 2 KV heads * (16 + 16) * 4 B = 65536 B per layer;
one-token activation peak: residual 3 * 64 * 4 = 768 (embeddings, layer input, norm) + rotary
cos/sin 2 * 16 * 4 = 128 + MLP 3 * 128 * 4 = 1536 + the attention sum beside it 64 * 4 = 256
-> 2688 B.
"""

from __future__ import annotations

import pytest
import torch

from workbench.big_modeling.errors import BadInputError, MemoryBudgetError
from workbench.big_modeling.planning.activation_reserve import estimate_activation_reserve
from workbench.big_modeling.planning.device_reserve import (
    layer_module_names,
    reserve_for_device_map,
)
from workbench.big_modeling.planning.planner import MAX_RESERVE_ROUNDS, plan_device_map

KIB = 1024
LAYER = 147968  # one decoder layer of tiny_llama, float32
EMBED = 32768
KV = 65536  # one layer's cache at 256 tokens
ACTIVATION = 2688  # a one-token forward's peak


def test_llama_reserve_golden(llama_config) -> None:
    # kv: 2 layers * 1 * 32 tokens * 2 kv heads * (16 + 16) * 2 B = 8192 B
    # activation (sdpa, logits of 1 position): residual 3 * 32 * 64 * 2 = 12288
    #   + rotary cos/sin 2 * 32 * 16 * 2 = 2048
    #   + max(attention: queries + output 2 * 4 * 32 * 16 * 2 = 8192,
    #         MLP 3 * 32 * 128 * 2 = 24576 + attention sum 32 * 64 * 2 = 4096, logits 256)
    assert estimate_activation_reserve(llama_config, batch_size=1, seq_len=32) == (
        8192 + 12288 + 2048 + 24576 + 4096
    )


def test_gpt2_reserve_uses_its_spelling(gpt2_config) -> None:
    # n_layer 2, n_embd 32, n_head 4 (no GQA: 4 kv heads of 8), n_inner None -> 4 * 32 = 128
    # kv: 2 layers * 2 batch * 16 * 4 heads * (8 + 8) * 4 B (float32) = 16384 B
    # activation: residual 3 * 2 * 16 * 32 * 4 = 12288 + position embeddings 16 * 32 * 4 = 2048
    #   + MLP (gelu_new: input, x / 2, x ** 3, 0.044715 x ** 3) 4 * 2 * 16 * 128 * 4 = 65536
    #   + attention output and sum 2 * 2 * 16 * 32 * 4 = 8192
    #   (> attention: queries + output 2 * 2 * 4 * 16 * 8 * 4 = 8192, logits 2 * 96 * 4 = 768)
    reserve = estimate_activation_reserve(gpt2_config, 2, 16, dtype=torch.float32)
    assert reserve == 16384 + 12288 + 2048 + 65536 + 8192


def test_reserve_grows_with_context(llama_config) -> None:
    short = estimate_activation_reserve(llama_config, 1, 128, dtype="bfloat16")
    long = estimate_activation_reserve(llama_config, 1, 4096, dtype="bfloat16")
    assert long == 32 * short  # sdpa: KV, residual and MLP all linear in the tokens


def test_reserve_feeds_the_planner(tiny_llama, llama_config) -> None:
    reserve = estimate_activation_reserve(llama_config, 1, 256)
    budgets = {0: "700KiB", "cpu": "1GiB"}  # model: 321 KiB, reserve: 640 KiB
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

    with pytest.raises(BadInputError, match="no layer count"):
        estimate_activation_reserve(NotAModelConfig(), 1, 10)


def _memory_model(llama_config, model):
    """The runtime's wiring, by hand: each layer's cache charged to the layer, the whole
    per-device reserve as ``reserve_for_map`` (one-token prefill, 256-token cache)."""
    names = layer_module_names((n for n, _ in model.named_modules()), 2)
    charges = {name: KV for name in names.values()}

    def reserve_for_map(device_map):
        reserves = reserve_for_device_map(
            llama_config, device_map, context=256, model_dtype=torch.float32, prompt_tokens=1
        )
        return {device: reserve.nbytes for device, reserve in reserves.items()}

    return charges, reserve_for_map


def _plain_and_reserved(tiny_llama, llama_config, budgets: dict) -> tuple:
    """The sequential plan without a reserve, and with each layer's cache on its device."""
    charges, reserve_for_map = _memory_model(llama_config, tiny_llama)
    options = {"max_memory": budgets, "strategy": "sequential",
               "no_split_module_classes": ["LlamaDecoderLayer"]}  # fmt: skip
    plain = plan_device_map(tiny_llama, **options)
    return plain, plan_device_map(
        tiny_llama, **options, reserve_for_map=reserve_for_map, charges=charges
    )


def test_each_layer_takes_its_cache_to_its_gpu(tiny_llama, llama_config) -> None:
    budgets = {0: 100 * KIB, 1: 340 * KIB, 2: 300 * KIB}
    _, reserve_for_map = _memory_model(llama_config, tiny_llama)
    plain, plan = _plain_and_reserved(tiny_llama, llama_config, budgets)
    # GPU 0 (102400 B) keeps room for the largest layer still to place (147968 B): it holds
    # nothing, either way. Without a reserve GPU 1 (348160 B) holds embed + both layers + norm
    # + rotary = 32768 + 2 * 147968 + 256 + 64 = 329024 B.
    assert plain.device_map == {"": 1}
    # With each layer's cache a layer needs 147968 + 65536 = 213504 B: GPU 1 takes embed and
    # layer 0 (32768 + 213504 = 246272; a second layer would make 459776 > 348160), layer 1
    # goes to GPU 2. Each GPU then keeps one layer's cache + the activation peak free:
    # 65536 + 2688 = 68224 B (round 2 confirms: 2688 B left beyond the charged caches).
    assert plan.device_map == {
        "model.embed_tokens": 1,
        "model.layers.0": 1,
        "model.layers.1": 2,
        "model.norm": 2,
        "model.rotary_emb": 2,
        "lm_head": 1,
    }
    assert plan.per_device_bytes == {1: EMBED + LAYER, 2: LAYER + 256 + 64}
    assert plan.reserve == {1: KV + ACTIVATION, 2: KV + ACTIVATION}
    # the plain map would not run: GPU 1 needs 329024 + 2 * 65536 + 2688 = 462784 > 348160
    assert sum(reserve_for_map(plain.device_map).values()) + 329024 > 340 * KIB
    for device, nbytes in plan.per_device_bytes.items():
        assert nbytes + plan.reserve[device] <= budgets[device]
    layer_row = next(p for p in plan.trace if p.module == "model.layers.1")
    assert layer_row.nbytes == LAYER and "64 KiB of the size needed is KV cache" in layer_row.reason


def test_offloaded_layers_keep_their_cache_on_the_gpu_that_runs_them(
    tiny_llama, llama_config
) -> None:
    budgets = {0: 100 * KIB, 1: 300 * KIB, "cpu": 1024 * KIB}
    plain, plan = _plain_and_reserved(tiny_llama, llama_config, budgets)
    # Without a reserve GPU 1 (307200 B) takes embed + layer 0 (180736 B), layer 1 the CPU.
    assert plain.device_map["model.layers.0"] == 1
    # Dispatch runs CPU layers on the map's first GPU (GPU 1 here), so their caches live there.
    # Round 1 gives the plain split; it needs on GPU 1: 2 caches + activation = 133760 B, of
    # which 65536 came with layer 0 -> 68224 B more. Round 2: 307200 - 68224 = 238976 B holds
    # embed (32768) but not layer 0 with its cache (+213504). Round 3 reserves both caches
    # (133760 B) and the map stays: 32768 + 133760 = 166528 B <= 307200. Layer 0 on GPU 1 would
    # need 32768 + 147968 + 133760 = 314496 B > 307200.
    assert plan.device_map == {
        "model.embed_tokens": 1,
        "model.layers": "cpu",
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": 1,
    }
    assert plan.reserve == {1: 2 * KV + ACTIVATION}
    assert plan.per_device_bytes == {1: EMBED, "cpu": 2 * LAYER + 256 + 64}


def test_no_options_means_no_reserve(tiny_llama) -> None:
    budgets = {0: 100 * KIB, 1: 340 * KIB, 2: 300 * KIB}
    plan = plan_device_map(tiny_llama, max_memory=budgets, strategy="sequential")
    assert plan.reserve == {} and plan.reserve_why == {}


def test_a_reserve_that_never_settles_is_an_error(tiny_llama) -> None:
    rounds = []

    def growing(device_map):
        rounds.append(dict(device_map))
        return {0: len(rounds)}  # needs a byte more every round

    with pytest.raises(MemoryBudgetError, match=f"after {MAX_RESERVE_ROUNDS} rounds"):
        plan_device_map(
            tiny_llama, max_memory={0: 1024 * KIB}, strategy="sequential", reserve_for_map=growing
        )
    assert len(rounds) == MAX_RESERVE_ROUNDS


def test_a_reserve_larger_than_the_whole_budget_is_refused(tiny_llama) -> None:
    # Everything goes to disk (the cpu keeps 64 KiB and its reserve is 1 MiB), and the cpu
    # that runs the disk layers needs 1 MiB of reserve: the fixed point settles at once (the
    # map cannot change), but 0 B of weights + 1 MiB > 64 KiB, so no map fits.
    def cpu_runs_everything(device_map):
        return {"cpu": 1024 * KIB}

    with pytest.raises(MemoryBudgetError, match=r"cpu needs .* of reserve, over its 64 KiB budget"):
        plan_device_map(
            tiny_llama,
            max_memory={"cpu": 64 * KIB, "disk": 1 << 40},
            strategy="sequential",
            reserve_for_map=cpu_runs_everything,
        )


def test_charges_must_name_modules(tiny_llama) -> None:
    with pytest.raises(BadInputError, match=r"lacks: model\.layers\.9"):
        plan_device_map(
            tiny_llama,
            max_memory={0: 1024 * KIB},
            strategy="sequential",
            charges={"model.layers.9": 1},
        )


def test_a_chunked_prefill_counts_its_last_chunk_over_the_whole_context(llama_config) -> None:
    """Eager scores grow with what a chunk attends to: the last 256-token chunk of a 1024-token
    context scores 256 x 1024 positions, four times the first chunk's 256 x 256."""
    from workbench.big_modeling.planning.activation_peak import forward_peak_terms
    from workbench.big_modeling.planning.device_reserve import reserve_per_device
    from workbench.big_modeling.planning.kv_cache import layout_of

    layout = layout_of(llama_config)

    def peak(past: int) -> int:
        terms = forward_peak_terms(layout, batch=1, tokens=256, past=past, nbytes=2,
                                   attention="eager", logits_to_keep=1)  # fmt: skip
        return (
            terms["residual"]
            + terms["mask"]
            + max(terms[k] for k in ("attention", "mlp", "logits"))
        )

    reserves = reserve_per_device(llama_config, ["cpu"] * len(layout.layers), context=1024,
                                  prompt_tokens=256, attention="eager", model_dtype="fp16")  # fmt: skip
    assert reserves["cpu"].activation_nbytes == peak(768) > peak(0)
    whole = reserve_per_device(llama_config, ["cpu"] * len(layout.layers), context=1024,
                               attention="eager", model_dtype="fp16")  # fmt: skip
    assert whole["cpu"].activation_nbytes > reserves["cpu"].activation_nbytes
