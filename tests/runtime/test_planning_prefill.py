"""The prefill length in the memory model: ``MemoryOptions(prefill_tokens=...)`` sizes the
activation reserve for one prefill chunk, the KV cache stays the context's, and the "why" says
so; the options survive JSON (a session file's ``"memory"``)."""

from __future__ import annotations

import json

import pytest

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.planning.device_reserve import reserve_for_device_map
from workbench.models.intake import open_model
from workbench.runtime.planning import (
    MemoryOptions,
    attention_layout,
    device_reserves,
    plan_opened_model,
    planned_prefill,
)

GIB = 2**30


@pytest.fixture(scope="module")
def llama8b():
    return open_model("llama-3.1-8b")


def test_a_chunk_keeps_the_cache_and_shrinks_the_activation_peak(llama8b) -> None:
    device_map = {"model.embed_tokens": 0, "model.layers": 0, "model.norm": 1, "lm_head": 1}
    whole = device_reserves(llama8b, device_map, MemoryOptions())[0]
    chunked = device_reserves(llama8b, device_map, MemoryOptions(prefill_tokens=2048))[0]
    # 32 layers x 32768 tokens x 8 KV heads x (128 + 128) x 2 B = 4 GiB either way
    assert whole.kv_nbytes == chunked.kv_nbytes == 4 * GIB
    # the engine's figure for a 2048-token forward through the 32 layers at a 32k context
    (engine,) = reserve_for_device_map(
        attention_layout(llama8b), {"": 0}, context=32768, prompt_tokens=2048,
        model_dtype="bfloat16",
    ).values()  # fmt: skip
    assert chunked.activation_nbytes == engine.activation_nbytes
    # the last chunk attends to 32768 keys with a cache before it, so sdpa gets a mask (is_causal
    # cannot say where the queries start) and transformers repeats K/V to the 32 heads:
    # residual 3 x 2048 x 4096 x 2 + rotary 2 x 2048 x 128 x 2        =    51,380,224
    # bool mask 2048 x 32768                                          =    67,108,864
    # attention: queries 32 x 2048 x 128 x 2 + K/V repeated 2 x 32 x 32768 x 128 x 2
    #   + output 32 x 2048 x 128 x 2 + additive mask 2048 x 32768 x 2 =   704,643,072
    # (MLP 3 x 2048 x 14336 x 2 + 2048 x 4096 x 2 = 192,937,984 is smaller)
    assert chunked.activation_nbytes == 51_380_224 + 67_108_864 + 704_643_072  # 785 MiB
    assert chunked.activation_nbytes < whole.activation_nbytes / 4  # 3.64 GiB in one forward
    assert not whole.why.endswith("chunks")
    assert chunked.why.split("; activation")[0] == whole.why.split("; activation")[0]
    assert chunked.why.endswith("(attention) for 2k-token prefill chunks")


def test_the_prefill_is_at_most_the_context(llama8b) -> None:
    assert planned_prefill(llama8b, MemoryOptions()) == 32768  # the capped maximum
    assert planned_prefill(llama8b, MemoryOptions(context=4096, prefill_tokens=512)) == 512
    longer = MemoryOptions(context=4096, prefill_tokens=8192)
    assert planned_prefill(llama8b, longer) == 4096
    assert device_reserves(llama8b, {"": 0}, longer) == device_reserves(
        llama8b, {"": 0}, MemoryOptions(context=4096)
    )


def test_the_planner_keeps_the_chunks_reserve_free(llama8b) -> None:
    budgets = {0: 12 * GIB, "cpu": 64 * GIB}
    whole = plan_opened_model(llama8b, max_memory=budgets, memory=MemoryOptions())
    chunked = plan_opened_model(
        llama8b, max_memory=budgets, memory=MemoryOptions(prefill_tokens=1024)
    )
    assert chunked.reserve[0] < whole.reserve[0]
    on_gpu = [name for name, device in chunked.device_map.items() if device == 0]
    assert len(on_gpu) > len([n for n, d in whole.device_map.items() if d == 0])
    assert chunked.per_device_bytes[0] + chunked.reserve[0] <= budgets[0]
    assert chunked.reserve_why[0].endswith("for 1k-token prefill chunks")


def test_options_round_trip_through_json_and_refuse_bad_values() -> None:
    options = MemoryOptions(batch=2, context=8192, kv_dtype="fp8", engine="vllm",
                            context_cap=65536, prefill_tokens=512)  # fmt: skip
    assert MemoryOptions.from_dict(json.loads(json.dumps(options.to_dict()))) == options
    assert MemoryOptions.from_dict({}) == MemoryOptions()
    assert MemoryOptions.from_dict({"batch": 3}) == MemoryOptions(batch=3)
    with pytest.raises(BadInputError, match="prefill_tokens=0"):
        MemoryOptions(prefill_tokens=0)
    with pytest.raises(BadInputError, match="unknown memory options: chunk"):
        MemoryOptions.from_dict({"chunk": 512})
    with pytest.raises(BadInputError, match="wrong type: batch=True"):
        MemoryOptions.from_dict({"batch": True})
    with pytest.raises(BadInputError, match="wrong type: context='8k'"):
        MemoryOptions.from_dict({"context": "8k"})
    with pytest.raises(BadInputError, match="unknown KV cache dtype 'fp4'"):
        MemoryOptions.from_dict({"kv_dtype": "fp4"})
