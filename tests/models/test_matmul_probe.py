"""The CPU's one-token matmul time by weight size: measured, cached, interpolated, carried by
the detected profile and profile files, and read by the speed model for CPU Linear layers."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.models.errors import ProfileError
from workbench.models.hardware import (
    HardwareProfile,
    detect_hardware,
    load_profile,
    profile_from_dict,
    with_host_probes,
)
from workbench.models.intake import open_model
from workbench.models.kernel_costs import DOCUMENTED_CPU, KernelCosts
from workbench.models.matmul_probe import (
    MatmulCurve,
    _stream,
    cached_matmul_curve,
    measure_context_seconds,
    measure_matmul_curve,
    measure_prefill_flops,
)
from workbench.models.probe_process import run_probe_process
from workbench.models.speed import LayerPrediction, predict_speed
from workbench.models.tree import build_module_tree
from workbench.runtime.precision_planning import with_tensor_sizes

CURVE = MatmulCurve(
    points={"float16": [[1e6, 1e-4], [4e6, 2e-4]], "float32": [[1000, 1e-5], [3000, 2e-5]]},
    threads=2,
    measured_at=0.0,
    prefill_flops={"float16": 2e10, "float32": 1e11},
    transposed_points={"float16": [[1e6, 1e-3], [4e6, 4e-3]]},
    context_s={"float32": 0.0, "float16": 0.0},
    prefill_rows_flops={"float16": [[8, 2e10], [128, 2e10]]},
    transposed_prefill_rows_flops={"float16": [[8, 1e9], [128, 1e9]]},
)


def test_the_curve_interpolates_between_its_points_and_extends_its_last_slope() -> None:
    assert CURVE.seconds(500, "float32") == pytest.approx(5e-6)  # proportional below
    assert CURVE.seconds(2000, "float32") == pytest.approx(1.5e-5)
    assert CURVE.seconds(5000, "float32") == pytest.approx(2e-5 + 2000 * 1e-5 / 2000)
    assert CURVE.seconds(0, "float32") == 0.0
    assert CURVE.seconds(1000, "bfloat16") is None  # no points: the bandwidth decides


def test_the_probe_times_real_matmuls(monkeypatch) -> None:
    context = []
    monkeypatch.setattr(
        "workbench.models.matmul_probe.measure_context_seconds",
        lambda dtypes: context.append(dtypes) or {"float32": 1e-5},
    )
    curve = measure_matmul_curve(
        dtypes=("float32",), sizes=(4096, 65536), stream_bytes=2**20, repeats=1
    )
    points = curve.points["float32"]
    assert [point[0] for point in points] == [32 * 32 * 4, 128 * 128 * 4]  # square weights
    assert all(seconds > 0 for _, seconds in points)
    assert [point[0] for point in curve.transposed_points["float32"]] == [4096, 65536]
    assert context == [("float32",)] and curve.complete
    assert [rows for rows, _ in curve.prefill_rows_flops["float32"]] == [8, 32, 128]
    assert [rows for rows, _ in curve.transposed_prefill_rows_flops["float32"]] == [8, 32, 128]


def test_a_stream_mixes_distinct_weights_of_every_size() -> None:
    stream = _stream("float32", (4096, 65536), 2**20, transposed=False, seed=0)
    sizes = [index for index, _, _ in stream]
    # half a MiB of each size (at least two): 128 of 4 KB, 8 of 64 KB, shuffled
    assert sizes.count(0) == 128 and sizes.count(1) == 8 and sizes != sorted(sizes)
    assert len({id(weight) for _, weight, _ in stream}) == len(stream)


def test_the_context_probe_times_a_real_decode_step() -> None:
    seconds = measure_context_seconds(("float32",), repeats=1, steps=2, width=128, layers=2)
    assert set(seconds) == {"float32"} and seconds["float32"] >= 0.0


def test_a_matmul_call_inside_a_forward_adds_the_context_seconds() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1000, 1000, bias=False), nn.Linear(1000, 1000, bias=False))
    tree = build_module_tree(model, dtype=torch.float16)
    base = replace(load_profile("cpu-laptop-16gb"), module_call_us=0.0, forward_call_us=0.0)
    quiet = predict_speed(tree, {"": "cpu"}, replace(base, cpu_matmul_curve=CURVE)).per_layer
    busy_curve = replace(CURVE, context_s={"float16": 7e-6})
    busy = predict_speed(tree, {"": "cpu"}, replace(base, cpu_matmul_curve=busy_curve)).per_layer
    # each Linear is one call: its curve time (1e-4 + 1e-4 / 3 for 2e6 B) plus 7 us
    assert quiet[0].compute_s == pytest.approx(1e-4 + 1e-4 / 3)
    assert busy[0].compute_s == pytest.approx(quiet[0].compute_s + 7e-6)
    assert busy_curve.call_seconds(0, "float16") == 0.0  # no weight: no call


def test_the_curve_is_cached_per_machine(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    calls = []

    def measure() -> MatmulCurve:
        calls.append(1)
        return CURVE

    assert cached_matmul_curve(measure_if_missing=False) is None
    assert cached_matmul_curve(measure) == cached_matmul_curve(measure) == CURVE
    assert len(calls) == 1
    profile = detect_hardware(measure_links=False, measure_host_probes=False)
    assert profile.cpu_matmul_curve == CURVE
    assert "CPU matmuls timed by weight size" in profile.description


@pytest.mark.parametrize("missing", ["prefill_flops", "transposed_prefill_rows_flops"])
def test_a_curve_cached_before_the_prefill_probe_is_measured_again(
    tmp_path: Path, monkeypatch, missing: str
) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    old = replace(CURVE, **{missing: {}})
    assert cached_matmul_curve(lambda: old) is None  # measured, but still without it
    assert cached_matmul_curve(measure_if_missing=False) is None
    assert cached_matmul_curve(lambda: CURVE) == CURVE
    assert cached_matmul_curve(measure_if_missing=False) == CURVE


def test_a_conv1d_weight_is_read_on_the_curve_of_its_in_out_layout() -> None:
    # GPT-2's Conv1D stores (in, out) and runs x @ W, which this project's CPU runs 24x
    # slower than linear in float16
    from transformers.pytorch_utils import Conv1D

    with torch.device("meta"):
        model = nn.Sequential(Conv1D(1000, 1000), nn.Linear(1000, 1000, bias=False))
    tree = build_module_tree(model, dtype=torch.float16)
    base = replace(load_profile("cpu-laptop-16gb"), module_call_us=0.0, forward_call_us=0.0)
    layers = predict_speed(tree, {"": "cpu"}, replace(base, cpu_matmul_curve=CURVE)).per_layer
    # the 2,000,000 B weight: 1e-3 s + (1e6 / 3e6) x 3e-3 s on the (in, out) curve (its bias's
    # 2,000 B are read at the bandwidth); the Linear on the linear curve
    assert layers[0].compute_s == pytest.approx(1e-3 + 1e-3, rel=1e-4)
    assert layers[1].compute_s == pytest.approx(1e-4 + 1e-4 / 3)
    assert CURVE.seconds(2_000_000, "float32", transposed=True) is None  # no points
    # its prefill runs at the (in, out) layout's rate too: float16 addmm at 3 GFLOP/s on
    # that CPU, 10x below linear (GPT-2's 150-token TTFT: 0.65 s predicted, 6.1 s measured)
    prefill = predict_speed(
        tree, {"": "cpu"}, replace(base, cpu_matmul_curve=CURVE), prompt_tokens=128
    ).per_layer
    flops = 2 * (1000 * 1000 + 1000)  # per token: the weight and the bias
    assert prefill[0].prefill_compute_s == pytest.approx(layers[0].compute_s + flops * 128 / 1e9)
    assert prefill[1].prefill_compute_s == pytest.approx(layers[1].compute_s + 2e6 * 128 / 2e10)
    assert CURVE.prefill_flops_at("float16", 64, transposed=True) == 1e9


def test_a_cpu_blocks_elementwise_work_grows_with_its_tokens(demo_llama_dir: Path) -> None:
    # norms, rotary, activation and residuals: e x sqrt(N) per token and layer, measured at 3.2
    # us a token for SmolLM2-135M's layers, 48 ms of its 496-token prefill
    opened = open_model(demo_llama_dir)
    base = replace(load_profile("cpu-laptop-16gb"), module_call_us=0.0, forward_call_us=0.0)
    without, with_it = (replace(base, cpu_matmul_curve=CURVE, elementwise_ns=e) for e in (0.0, 2.0))

    def layers(profile: HardwareProfile, device_map: dict) -> dict[str, LayerPrediction]:
        prediction = predict_speed(opened, device_map, profile, prompt_tokens=100, batch_size=2)
        return {layer.name: layer for layer in prediction.per_layer}

    before, after = layers(without, {"": "cpu"}), layers(with_it, {"": "cpu"})
    params = opened.tree.node("model.layers.0").param_count
    per_token = 2e-9 * math.sqrt(params) * 2  # batch 2
    block = "model.layers.0"
    assert after[block].compute_s == pytest.approx(before[block].compute_s + per_token)
    assert after[block].prefill_compute_s == pytest.approx(
        before[block].prefill_compute_s + per_token * 100
    )
    for name in ("model.embed_tokens", "lm_head"):  # no block: counted in its dispatch
        assert after[name].prefill_compute_s == before[name].prefill_compute_s
    gpu = replace(load_profile("rtx4090-64gb"), elementwise_ns=2.0)
    on_gpu = layers(gpu, {"": 0})  # a GPU's bandwidth makes it nothing
    assert (
        on_gpu[block].prefill_compute_s
        == layers(replace(gpu, elementwise_ns=0.0), {"": 0})[block].prefill_compute_s
    )


def test_a_generating_prefill_runs_the_output_head_on_the_last_position_only(
    demo_llama_dir: Path,
) -> None:
    # generate keeps one position's logits (logits_to_keep=1) and an embedding looks rows up:
    # counted as every token's matmul, SmolLM2-135M's tied embedding took 77 ms of a
    # 496-token prefill where the head computes one row in 4 ms
    opened = open_model(demo_llama_dir)  # float16, untied lm_head
    base = replace(load_profile("cpu-laptop-16gb"), module_call_us=0.0, forward_call_us=0.0)
    profile = replace(base, cpu_matmul_curve=CURVE)

    def layers(**options: bool) -> dict[str, LayerPrediction]:
        prediction = predict_speed(opened, {"": "cpu"}, profile, prompt_tokens=128, **options)
        return {layer.name: layer for layer in prediction.per_layer}

    generating = layers()
    for name in ("model.embed_tokens", "lm_head"):  # one row: the decode step's read
        assert generating[name].prefill_compute_s == pytest.approx(generating[name].compute_s)
    block = generating["model.layers.0"]
    params = opened.tree.node("model.layers.0").param_count
    assert block.prefill_compute_s > block.compute_s + 2 * params * 128 / 2e10 * 0.99
    every = layers(last_position_only=False)  # an encoder's forward: every position
    head = opened.tree.node("lm_head").param_count
    assert every["lm_head"].prefill_compute_s == pytest.approx(
        generating["lm_head"].compute_s + 2 * head * 128 / 2e10
    )
    assert every["model.embed_tokens"].prefill_compute_s == pytest.approx(
        generating["model.embed_tokens"].compute_s  # a lookup still
    )
    assert every["model.layers.0"].prefill_compute_s == block.prefill_compute_s


def test_a_short_prompts_prefill_runs_at_its_row_counts_rate() -> None:
    # this project's CPU, bfloat16: 175 GFLOP/s at 8 rows, 418 at 128; a 5-token prompt's
    # forward took 1.3 decode steps, which max(FLOPs / the 128-row rate, read) called one.
    # The read and the FLOPs add: the CPU's GEMM packs the weight it reads, then multiplies
    # the packed copy
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1000, 1000, bias=False))
    tree = build_module_tree(model, dtype=torch.float16)
    rows = replace(CURVE, prefill_rows_flops={"float16": [[8, 1e10], [128, 4e10]]})
    base = replace(load_profile("cpu-laptop-16gb"), module_call_us=0.0, forward_call_us=0.0)
    profile = replace(base, cpu_matmul_curve=rows)
    read = 1e-4 + 1e-4 / 3  # the 2e6 B weight's one-token time on the curve

    def prefill(tokens: int) -> float:
        return (
            predict_speed(tree, {"": "cpu"}, profile, prompt_tokens=tokens)
            .per_layer[0]
            .prefill_compute_s
        )

    assert rows.prefill_flops_at("float16", 68) == pytest.approx(2.5e10)  # halfway
    assert (
        rows.prefill_flops_at("float16", 4) == 1e10
        and rows.prefill_flops_at("float16", 999) == 4e10
    )
    assert prefill(68) == pytest.approx(read + 2e6 * 68 / 2.5e10)  # 2 x 1e6 params x 68 tokens
    assert prefill(500) == pytest.approx(read + 2e6 * 500 / 4e10)
    at_8 = read + 2e6 * 8 / 1e10  # the read and 1.6 ms
    assert prefill(1) == pytest.approx(read)
    assert prefill(5) == pytest.approx(read + (at_8 - read) * 4 / 7)  # linear to 8 rows
    assert prefill(8) == pytest.approx(at_8)


def test_the_prefill_probe_times_real_matmuls_per_dtype() -> None:
    rates = measure_prefill_flops(("float32", "bfloat16"), rows=16, side=128, repeats=1)
    assert set(rates) == {"float32", "bfloat16"} and all(rate > 0 for rate in rates.values())


def test_a_cpu_prefill_runs_at_the_probes_rate_for_its_dtype() -> None:
    # nominal peaks say nothing of a CPU's bf16 prefill: this project's AVX2 CPU has no bf16
    # arithmetic (SmolLM2-135M's 110-token prefill: 1.70 s measured, 0.17 s from its TFLOP/s)
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1000, 1000, bias=False), nn.LayerNorm(1000))
    tree = build_module_tree(model, dtype=torch.float16)
    base = replace(load_profile("cpu-laptop-16gb"), module_call_us=0.0, forward_call_us=0.0)
    timed = predict_speed(
        tree, {"": "cpu"}, replace(base, cpu_matmul_curve=CURVE), prompt_tokens=500
    ).per_layer
    # the weight's one-token read on the curve, then 2 x 1e6 weights x 500 tokens at the
    # probe's 2e10 FLOP/s for float16
    read = 1e-4 + 1e-4 / 3
    assert timed[0].prefill_compute_s == pytest.approx(read + 2e6 * 500 / 2e10)
    nominal = predict_speed(tree, {"": "cpu"}, base, prompt_tokens=500).per_layer
    flops = base.device("cpu").compute_tflops * 1e12 * 0.5
    assert nominal[0].prefill_compute_s == pytest.approx(
        max(2e6 * 500 / flops, 2e6 / (base.device("cpu").memory_bandwidth_gbps * 1e9 * 0.8))
    )


def test_a_profile_file_carries_the_curve() -> None:
    data = {**load_profile("cpu-laptop-16gb").to_dict(), "cpu_matmul_curve": CURVE.__dict__}
    assert profile_from_dict(data).cpu_matmul_curve == CURVE
    again = profile_from_dict(profile_from_dict(data).to_dict())
    assert again.cpu_matmul_curve == CURVE
    bad = {**data, "cpu_matmul_curve": {**CURVE.__dict__, "points": {"float32": [[0, 1.0]]}}}
    with pytest.raises(ProfileError, match="'cpu_matmul_curve' points must be"):
        profile_from_dict(bad)


def test_a_cpu_linear_is_read_in_the_curves_time() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1000, 1000, bias=False), nn.LayerNorm(1000))
    tree = build_module_tree(model, dtype=torch.float16)
    base = replace(load_profile("cpu-laptop-16gb"), module_call_us=0.0, forward_call_us=0.0)
    bandwidth = base.device("cpu").memory_bandwidth_gbps * 1e9 * 0.8
    plain = predict_speed(tree, {"": "cpu"}, base).per_layer
    flops = base.device("cpu").compute_tflops * 1e12 * 0.5
    assert plain[0].compute_s == pytest.approx(max(2e6 / bandwidth, 2e6 / flops))
    timed = predict_speed(tree, {"": "cpu"}, replace(base, cpu_matmul_curve=CURVE)).per_layer
    # the 2,000,000 B float16 weight: 1e-4 s + (1e6 / 3e6) x 1e-4 s on the curve
    assert timed[0].compute_s == pytest.approx(1e-4 + 1e-4 / 3)
    assert timed[1].compute_s == plain[1].compute_s  # a LayerNorm is no matmul


def test_a_tree_counted_as_stored_reads_each_weight_on_its_stored_dtypes_curve() -> None:
    # a float16 checkpoint opened as stored (no planning dtype) runs its float16 kernels: read
    # by its bytes per parameter it was taken for bfloat16, which on this project's AVX-512 CPU
    # decodes two to three times slower at these sizes (a 60M float16 Llama: -46%, now -12%)
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1000, 1000, bias=False), nn.LayerNorm(1000)).half()
    tree = build_module_tree(model)  # as stored
    assert tree.planning_dtype is None and tree.tensor_dtypes["0.weight"] == torch.float16
    profile = replace(
        load_profile("cpu-laptop-16gb"),
        module_call_us=0.0,
        forward_call_us=0.0,
        cpu_matmul_curve=CURVE,  # float16 points, none for bfloat16
    )
    layers = predict_speed(tree, {"": "cpu"}, profile, prompt_tokens=64).per_layer
    assert layers[0].compute_s == pytest.approx(1e-4 + 1e-4 / 3)  # the float16 curve
    # and the prefill runs at the float16 FLOP/s the probe measured (2e10), after the read
    assert layers[0].prefill_compute_s == pytest.approx(1e-4 + 1e-4 / 3 + 2 * 1e6 * 64 / 2e10)


def test_a_dense_copy_cpu_linear_is_the_curves_matmul_plus_its_dequantization() -> None:
    # nf4 dequantizes into a dense buffer, then one 16-bit matmul runs on it: the curve's
    # 16-bit time plus the time the measured efficiency says the weight takes beyond its 16-bit
    # bytes, at the CPU's read rate (the efficiencies are measured against the 16-bit kernel,
    # device_probe). The product of the two scaled a small weight's fixed per-call cost by the
    # large weight's ratio: SmolLM2-135M in nf4 12.4 tok/s predicted, 16.4 measured.
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1000, 1000, bias=False), nn.LayerNorm(1000))
    tree = build_module_tree(model, dtype=torch.float16)
    packed_bytes = 562_500  # 1e6 weights: 4 bits each plus a float32 scale per 64
    sized = with_tensor_sizes(tree, {**tree.tensor_nbytes, "0.weight": packed_bytes})
    profile = replace(
        load_profile("cpu-laptop-16gb"),
        module_call_us=0.0,
        forward_call_us=0.0,
        cpu_matmul_curve=CURVE,
    )
    read_bw = profile.device("cpu").memory_bandwidth_gbps * 1e9 * 0.8
    sixteen_bit = 1e-4 + 1e-4 / 3  # the curve's time for the 2,000,000 B float16 weight
    costs = KernelCosts(cpu={**DOCUMENTED_CPU, "nf4": 0.05, "int4": 0.5})
    nf4 = predict_speed(
        sized, {"": "cpu"}, profile, precisions={"0": "nf4"}, kernel_costs=costs
    ).per_layer
    # 562,500 B at 0.05 of the 16-bit rate reads as 11.25 MB would: 9.25 MB beyond its 2 MB
    assert nf4[0].compute_s == pytest.approx(sixteen_bit + (packed_bytes / 0.05 - 2e6) / read_bw)
    # int4 runs a fused kernel (tinygemm): its efficiency scales the 16-bit time itself
    int4 = predict_speed(
        sized, {"": "cpu"}, profile, precisions={"0": "int4-g128"}, kernel_costs=costs
    ).per_layer
    assert int4[0].compute_s == pytest.approx(sixteen_bit * packed_bytes / 2e6 / 0.5)
    # a kernel faster than its 16-bit bytes adds nothing to the matmul
    quick = KernelCosts(cpu={**DOCUMENTED_CPU, "nf4": 0.9})
    fast = predict_speed(
        sized, {"": "cpu"}, profile, precisions={"0": "nf4"}, kernel_costs=quick
    ).per_layer
    assert fast[0].compute_s == pytest.approx(sixteen_bit)


def test_this_machines_probes_run_apart_once_and_are_cached(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    typical = detect_hardware(measure_links=False)  # reads the caches only: none yet
    assert typical.cpu_matmul_curve is None and not typical.dispatch_measured
    measured = with_host_probes(typical)  # both probes, each in a fresh process
    assert set(measured.cpu_matmul_curve.points) == {"bfloat16", "float16", "float32"}
    for points in measured.cpu_matmul_curve.points.values():
        assert [point[0] for point in points] == sorted(point[0] for point in points)
        assert all(seconds > 0 for _, seconds in points)
    assert measured.dispatch_measured and measured.module_call_us > 0
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "cpu-matmul-curve.json",
        "dispatch-overhead.json",
    ]
    again = detect_hardware(measure_links=False)  # now from the caches
    assert again.cpu_matmul_curve == measured.cpu_matmul_curve
    assert again.module_call_us == measured.module_call_us
    assert "dispatch measured" in again.description


def test_a_failed_probe_process_names_itself() -> None:
    with pytest.raises(RuntimeError, match=r"the test probe failed \(exit 1\).*No module named"):
        run_probe_process("workbench.models.no_such_probe", {}, what="the test probe")
