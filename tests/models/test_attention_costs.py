"""Attention's share of a decode step and of a prefill: by hand for each attention kind, from
this CPU's measured times, and in the speed model as the context grows."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from workbench.big_modeling.planning.attention_kinds import LayerAttention, MlaShape, StateShape
from workbench.models import attention_probe
from workbench.models.attention_costs import (
    CACHE_TRAFFIC,
    attention_by_module,
    attention_seconds,
    attention_shape,
)
from workbench.models.attention_probe import (
    AttentionShape,
    AttentionTimes,
    cached_attention_times,
    measure_attention_times,
)
from workbench.models.device_probe import cpu_kernel_cache_key
from workbench.models.hardware import load_profile
from workbench.models.intake import open_model
from workbench.models.speed import attention_shapes_for, predict_speed
from workbench.runtime.planning import attention_layout

GQA = LayerAttention(index=0, kind="full", heads=32, kv_heads=8, head_dim=128, v_head_dim=128)
RATES = {"flops_per_s": 1e12, "prefill_flops_per_s": 2e12, "memory_bytes_per_s": 1e11}


def test_a_gqa_layer_by_hand() -> None:
    seconds = attention_seconds(GQA, dtype="float16", batch=2, context=4096, prompt=1000, **RATES)
    # decode: the cache, 2 x 4096 tokens x 8 heads x (128 + 128) x 2 B = 33.5 MB, moved 3 times
    # at 1e11 B/s = 1.007 ms; its FLOPs, 2 x 2 x 32 x 4096 x 256 = 134 MFLOP at 1e12: 0.134 ms
    cache = 2 * 4096 * 8 * 256 * 2
    assert CACHE_TRAFFIC == 3
    assert seconds.decode_s == pytest.approx(3 * cache / 1e11)
    # prefill: 2 x 2 x 32 heads x 256 x (1000 x 1001 / 2 causal pairs) at 2e12 FLOP/s
    assert seconds.prefill_s == pytest.approx(2 * 2 * 32 * 256 * 1000 * 1001 / 2 / 2e12)
    assert not seconds.measured


def test_a_sliding_layer_decodes_over_its_window_and_prefills_every_pair() -> None:
    sliding = LayerAttention(0, "sliding", 32, 8, 128, 128, window=512)
    long = attention_seconds(sliding, dtype="float16", batch=1, context=8192, prompt=8192, **RATES)
    windowed = attention_seconds(GQA, dtype="float16", batch=1, context=512, prompt=8192, **RATES)
    assert long.decode_s == pytest.approx(windowed.decode_s)  # 512 tokens kept, not 8192
    full = attention_seconds(GQA, dtype="float16", batch=1, context=8192, prompt=8192, **RATES)
    assert long.prefill_s == pytest.approx(full.prefill_s)  # SDPA computes under a mask


def test_mla_runs_as_transformers_expands_it_and_state_space_adds_nothing() -> None:
    mla = LayerAttention(
        0, "mla", 16, 16, 192, 128, mla=MlaShape(512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                                                  v_head_dim=128)
    )  # fmt: skip
    shape = attention_shape(mla, "bfloat16")
    assert shape == AttentionShape(16, 16, 128 + 64, 128, "bfloat16")
    seconds = attention_seconds(mla, dtype="bfloat16", batch=1, context=100, prompt=10, **RATES)
    # the expanded cache: 100 tokens x 16 heads x (192 + 128) x 2 B, moved 3 times
    assert seconds.decode_s == pytest.approx(3 * 100 * 16 * 320 * 2 / 1e11)
    mamba = LayerAttention(0, "none", 8, 8, 64, 64, state=StateShape(64, 4, (8, 16), "mamba"))
    assert attention_shape(mamba, "float32") is None
    none = attention_seconds(mamba, dtype="float32", batch=1, context=10**5, prompt=10**5, **RATES)
    assert none.decode_s == none.prefill_s == 0.0


def test_measured_times_are_used_for_their_shape() -> None:
    times = AttentionTimes(
        decode=[[512.0, 0.5e-3], [4096.0, 3.0e-3]],
        prefill=[[256.0, 2e-3], [2048.0, 48e-3]],
        measured_at=0.0,
    )
    # decode: the line through both points, its intercept the call's fixed cost
    assert times.decode_seconds(2304) == pytest.approx(0.5e-3 + 1792 * 2.5e-3 / 3584)
    assert times.decode_seconds(1) > 0
    # prefill: a P + b P^2 through both points
    assert times.prefill_seconds(256) == pytest.approx(2e-3)
    assert times.prefill_seconds(2048) == pytest.approx(48e-3)
    b = (48e-3 / 2048 - 2e-3 / 256) / (2048 - 256)
    a = 2e-3 / 256 - b * 256
    assert times.prefill_seconds(8192) == pytest.approx(a * 8192 + b * 8192**2)
    key = attention_shape(GQA, "float16").key
    seconds = attention_seconds(
        GQA, dtype="float16", batch=2, context=2304, prompt=2048, times={key: times}, **RATES
    )
    assert seconds.measured
    assert seconds.decode_s == pytest.approx(2 * times.decode_seconds(2304))
    assert seconds.prefill_s == pytest.approx(2 * 48e-3)
    encoder = attention_seconds(
        GQA, dtype="float16", batch=1, context=64, prompt=256, times={key: times},
        encoder_only=True, **RATES,
    )  # fmt: skip
    assert encoder.decode_s == 0.0 and encoder.prefill_s == pytest.approx(2 * 2e-3)  # all pairs


def test_the_speed_model_slows_as_the_cache_grows(demo_llama_dir: Path) -> None:
    opened = open_model(str(demo_llama_dir))
    layout = attention_layout(opened)
    profile = load_profile("cpu-laptop-16gb")
    short = predict_speed(opened, {"": "cpu"}, profile, prompt_tokens=16)
    long = predict_speed(opened, {"": "cpu"}, profile, prompt_tokens=16, decode_context=4096)
    assert long.ttft_s == pytest.approx(short.ttft_s)  # the same prompt
    assert long.tokens_per_s < short.tokens_per_s
    by_name = {layer.name: layer for layer in long.per_layer}
    assert set(attention_by_module(by_name, layout)) == {
        f"model.layers.{i}" for i in range(len(layout.layers))
    }
    layer = by_name["model.layers.0"]
    cpu = profile.device("cpu")
    expected = attention_seconds(
        layout.layers[0], dtype="float16", batch=1, context=4096, prompt=16,
        flops_per_s=cpu.compute_tflops * 1e12 * 0.5,
        prefill_flops_per_s=cpu.compute_tflops * 1e12 * 0.5,
        memory_bytes_per_s=cpu.memory_bandwidth_gbps * 1e9 * 0.8,
    )  # fmt: skip
    assert layer.attention_s == pytest.approx(expected.decode_s) and layer.attention_s > 0
    assert by_name["model.embed_tokens"].attention_s == 0.0
    # a tree alone has no config: no attention terms unless its layout is given
    bare = predict_speed(opened.tree, {"": "cpu"}, profile, decode_context=4096)
    assert all(layer.attention_s == 0.0 for layer in bare.per_layer)
    given = predict_speed(opened.tree, {"": "cpu"}, profile, attention=layout, decode_context=4096)
    assert given.tokens_per_s == pytest.approx(
        predict_speed(opened, {"": "cpu"}, profile, decode_context=4096).tokens_per_s
    )
    # this CPU's measured times count for layers on the CPU only
    shape = attention_shapes_for(opened.tree, layout)[0]
    slow = AttentionTimes([[1.0, 1.0], [2.0, 1.0]], [[1.0, 1.0], [2.0, 4.0]], measured_at=0.0)
    timed = predict_speed(opened, {"": "cpu"}, profile, attention_times={shape.key: slow})
    assert timed.per_layer[1].attention_s == pytest.approx(1.0)


def test_a_prefill_between_measured_lengths_follows_the_two_around_it() -> None:
    # SmolLM2-135M's shape on this project's CPU: 1.2 ms at 256 tokens, 4.6 at 512, 13.2 at
    # 1024, 43.4 at 2048; the curve through 256 and 2048 alone said 3.3 ms at 496 (4.7 measured)
    points = [[256.0, 1.2e-3], [512.0, 4.6e-3], [1024.0, 13.2e-3], [2048.0, 43.4e-3]]
    times = AttentionTimes(decode=[[512.0, 1e-4], [4096.0, 1e-3]], prefill=points, measured_at=0)

    def through(low: list[float], high: list[float], tokens: int) -> float:
        (low_p, low_s), (high_p, high_s) = low, high
        b = max((high_s / high_p - low_s / low_p) / (high_p - low_p), 0.0)
        return max(low_s / low_p - b * low_p, 0.0) * tokens + b * tokens**2

    for tokens, seconds in points:  # each measured point exactly
        assert times.prefill_seconds(int(tokens)) == pytest.approx(seconds)
    assert times.prefill_seconds(496) == pytest.approx(through(points[0], points[1], 496))
    assert times.prefill_seconds(496) > 4.3e-3  # not the 3.3 ms of the outer curve
    assert times.prefill_seconds(700) == pytest.approx(through(points[1], points[2], 700))
    assert times.prefill_seconds(37) == pytest.approx(through(points[0], points[1], 37))
    assert times.prefill_seconds(8192) == pytest.approx(through(points[2], points[3], 8192))
    # a shape cached with two lengths (revision 1) still reads as one curve
    two = AttentionTimes(times.decode, [points[0], points[3]], measured_at=0)
    assert two.prefill_seconds(496) == pytest.approx(through(points[0], points[3], 496))


def test_a_shape_cached_before_the_four_prefill_lengths_is_measured_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shape = AttentionShape(heads=4, kv_heads=2, head_dim=16, v_head_dim=16, dtype="float32")
    cache = tmp_path / "cpu-attention.json"
    old = AttentionTimes([[512.0, 1e-4], [4096.0, 1e-3]], [[256.0, 1e-3], [2048.0, 5e-2]], 0.0)
    key = f"{cpu_kernel_cache_key()}; {shape.key}"  # revision 1's key
    cache.write_text(json.dumps({"version": 1, "machines": {key: asdict(old)}}))
    assert cached_attention_times([shape], measure_if_missing=False, cache_path=cache) == {}
    new = replace(old, prefill=[[256.0, 1e-3], [512.0, 4e-3], [1024.0, 1e-2], [2048.0, 5e-2]])
    monkeypatch.setattr(attention_probe, "measure_attention_times_apart", lambda shape: new)
    assert cached_attention_times([shape], cache_path=cache) == {shape.key: new}


def test_the_probe_times_real_attention_and_caches_each_shape(tmp_path: Path) -> None:
    shape = AttentionShape(heads=4, kv_heads=2, head_dim=16, v_head_dim=16, dtype="float32")
    times = measure_attention_times(shape, contexts=(16, 64), prompts=(8, 32), repeats=1)
    assert [point[0] for point in times.decode] == [16.0, 64.0]
    assert [point[0] for point in times.prefill] == [8.0, 32.0]
    assert all(seconds > 0 for _, seconds in times.decode + times.prefill)
    cache = tmp_path / "cpu-attention.json"
    assert cached_attention_times([shape], measure_if_missing=False, cache_path=cache) == {}
    measured = cached_attention_times([shape], cache_path=cache)  # in a fresh process
    assert list(measured) == [shape.key] and cache.is_file()
    again = cached_attention_times([shape, shape], measure_if_missing=False, cache_path=cache)
    assert again == measured


def test_a_long_context_makes_decode_attention_bound(demo_llama_dir: Path) -> None:
    opened = open_model(str(demo_llama_dir))
    profile = load_profile("cpu-laptop-16gb")
    short = predict_speed(opened, {"": "cpu"}, profile, prompt_tokens=16)
    assert short.bottleneck != "attention"
    long = predict_speed(opened, {"": "cpu"}, profile, prompt_tokens=16, decode_context=2**20)
    assert long.attention_s == pytest.approx(sum(layer.attention_s for layer in long.per_layer))
    assert long.attention_s > long.compute_s / 2 and long.bottleneck == "attention"
    assert long.to_dict()["attention_s"] == long.attention_s
    assert "(attention-bound" in long.summary()
