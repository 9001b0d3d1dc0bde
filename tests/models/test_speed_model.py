"""The speed model: golden per-layer times computed by hand, overlap, pinned vs pageable
copies, what each precision's kernel costs, and map/profile errors."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from workbench.big_modeling.errors import DeviceMapError
from workbench.models.hardware import DeviceSpec, HardwareProfile
from workbench.models.intake import open_model
from workbench.models.kernel_costs import DEFAULT_KERNEL_COSTS, KernelCosts, precision_kind
from workbench.models.speed import predict_speed
from workbench.models.tree import build_module_tree

PROFILE = HardwareProfile(
    name="toy",
    description="hand-checkable numbers",
    devices=(
        DeviceSpec(0, "gpu", 10**10, None, compute_tflops=100.0, memory_bandwidth_gbps=1000.0),
        DeviceSpec("cpu", "ram", 10**11, None, compute_tflops=1.0, memory_bandwidth_gbps=50.0),
        DeviceSpec("disk", "ssd", 10**12),
    ),
    host_to_device_gbps=10.0,
    disk_read_gbps=1.0,
    module_call_us=0.0,  # the hand-checked bandwidths alone; dispatch has its own tests
    forward_call_us=0.0,
)


@pytest.fixture(scope="module")
def toy_tree():
    # two layers of 1000x1000 fp16 weights: 1e6 params, 2,000,000 B each
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1000, 1000, bias=False), nn.Linear(1000, 1000, bias=False))
    return build_module_tree(model, dtype=torch.float16)


def test_gpu_and_cpu_offloaded_layer_by_hand(toy_tree) -> None:
    prediction = predict_speed(toy_tree, {"0": 0, "1": "cpu"}, PROFILE, prompt_tokens=100)
    first, second = prediction.per_layer
    # compute: max(2*1e6 flop / (100e12*0.5), 2e6 B / (1000e9*0.8)) = max(4e-8, 2.5e-6) = 2.5e-6 s
    assert first.compute_s == pytest.approx(2.5e-6)
    assert first.transfer_s == 0 and first.execution_device == 0
    # the cpu layer runs on GPU 0 after a 2e6 B / 10e9 B/s = 2e-4 s copy
    assert (second.device, second.execution_device) == ("cpu", 0)
    assert second.transfer_s == pytest.approx(2e-4)
    assert prediction.decode_s == pytest.approx(2.5e-6 + 2e-4)  # overlap: max per layer
    assert prediction.tokens_per_s == pytest.approx(1 / (2.5e-6 + 2e-4))
    # prefill of 100 tokens: max(2e8 / 5e13, 2.5e-6) = 4e-6 s of compute per layer
    assert first.prefill_compute_s == pytest.approx(4e-6)
    # one forward over the prompt (all an encoder runs): layer 0's 4e-6 s, layer 1's copy;
    # it yields the first token, so it is the time to first token as the inference test times it
    assert prediction.prefill_s == pytest.approx(4e-6 + 2e-4)
    assert prediction.ttft_s == prediction.prefill_s
    assert prediction.to_dict()["prefill_s"] == prediction.prefill_s
    assert prediction.bottleneck == "host-to-device"
    # without prefetch the hooks copy from pageable RAM: half the pinned 10 GB/s by default
    serial = predict_speed(toy_tree, {"0": 0, "1": "cpu"}, PROFILE, prefetch=False)
    assert serial.per_layer[1].transfer_s == pytest.approx(4e-4)
    assert serial.decode_s == pytest.approx(2.5e-6 + 4e-4 + 2.5e-6)
    assert serial.decode_s > prediction.decode_s


def test_pageable_bandwidth_is_the_profile_figure(toy_tree) -> None:
    measured = replace(PROFILE, host_to_device_pageable_gbps=2.0)
    serial = predict_speed(toy_tree, {"0": 0, "1": "cpu"}, measured, prefetch=False)
    assert serial.per_layer[1].transfer_s == pytest.approx(2e6 / 2e9)
    # with prefetch the prefetcher pins in-memory weights once: the pinned rate
    overlapped = predict_speed(toy_tree, {"0": 0, "1": "cpu"}, measured)
    assert overlapped.per_layer[1].transfer_s == pytest.approx(2e6 / 10e9)
    # disk weights are pinned afresh every forward: pageable, with or without prefetch
    disk = predict_speed(toy_tree, {"0": 0, "1": "disk"}, measured)
    assert disk.per_layer[1].transfer_s == pytest.approx(2e6 / 1e9 + 2e6 / 2e9)


def test_disk_layer_reads_then_copies(toy_tree) -> None:
    prediction = predict_speed(toy_tree, {"0": 0, "1": "disk"}, PROFILE)
    # 2e6 B / 1e9 B/s from disk + 2e6 B / 5e9 B/s (pageable: half of pinned) = 2.4e-3 s
    assert prediction.per_layer[1].transfer_s == pytest.approx(2.4e-3)
    assert prediction.bottleneck == "disk"
    # the disk's bandwidth is for cold reads: the page cache can serve them faster
    assert "(disk-bound at cold reads, faster from the page cache, prefetch on)" in (
        prediction.summary()
    )


def test_cpu_only_plan_has_no_transfers(toy_tree) -> None:
    prediction = predict_speed(toy_tree, {"": "cpu"}, PROFILE)
    assert all(
        layer.transfer_s == 0 and layer.execution_device == "cpu" for layer in prediction.per_layer
    )
    # memory-bound on the CPU: 2e6 B / (50e9 * 0.8) = 5e-5 s per layer
    # beats 2*1e6 flop / (1e12 * 0.5) = 4e-6 s of FLOPs
    assert prediction.decode_s == pytest.approx(2 * 5e-5)
    assert all(layer.memory_bound for layer in prediction.per_layer)
    assert prediction.bottleneck == "memory"
    assert "(memory-bound, prefetch on)" in prediction.summary()


def test_a_big_batch_makes_decode_compute_bound(toy_tree) -> None:
    # batch 64 on the CPU: 64 * 2e6 flop / 5e11 flop/s = 2.56e-4 s > 5e-5 s of weight reads
    prediction = predict_speed(toy_tree, {"": "cpu"}, PROFILE, batch_size=64)
    assert prediction.decode_s == pytest.approx(2 * 2.56e-4)
    assert not any(layer.memory_bound for layer in prediction.per_layer)
    assert prediction.bottleneck == "compute"
    # batch 8: 8 * 2e6 / 5e11 = 3.2e-5 s < 5e-5 s: still memory-bound
    assert predict_speed(toy_tree, {"": "cpu"}, PROFILE, batch_size=8).bottleneck == "memory"


def test_map_errors(toy_tree) -> None:
    with pytest.raises(DeviceMapError, match="uses 3, which hardware profile 'toy' does not have"):
        predict_speed(toy_tree, {"": 3}, PROFILE)
    with pytest.raises(
        DeviceMapError, match=r"no device for 1 tensors: 1.weight\. Add a covering key"
    ):
        predict_speed(toy_tree, {"0": 0}, PROFILE)


def test_layers_are_the_no_split_blocks_of_a_real_model(demo_llama_dir) -> None:
    opened = open_model(demo_llama_dir)
    layers = predict_speed(opened, {"": "cpu"}, PROFILE).per_layer
    names = [layer.name for layer in layers]
    blocks = [n.name for n in opened.tree.node("model.layers").children]
    assert names == ["model.embed_tokens", *blocks, "model.norm", "model.rotary_emb", "lm_head"]
    assert sum(layer.nbytes for layer in layers) == opened.tree.root.nbytes


def test_a_quantized_layer_is_read_at_its_kernels_efficiency(toy_tree) -> None:
    # layer 1 int8 (half the bytes: 1e6 B) on the CPU, whose int8 kernel reaches 0.25 of the
    # bf16 kernel's bandwidth: 1e6 / (50e9 * 0.8 * 0.25) = 1e-4 s, twice its bf16 time 5e-5 s
    costs = KernelCosts(cpu={"plain": 1.0, "int8": 0.25}, cuda={"plain": 1.0, "int8": 0.8})
    sized = with_sizes(toy_tree, {"1.weight": 10**6})
    prediction = predict_speed(
        sized, {"": "cpu"}, PROFILE, precisions={"1": "int8"}, kernel_costs=costs
    )
    first, second = prediction.per_layer
    assert first.compute_s == pytest.approx(5e-5) and first.precision == "plain"
    assert second.compute_s == pytest.approx(1e-4) and second.precision == "int8"
    # on the GPU the same bytes at 0.8: 1e6 / (1000e9 * 0.8 * 0.8) = 1.5625e-6 s
    on_gpu = predict_speed(sized, {"": 0}, PROFILE, precisions={"1": "int8"}, kernel_costs=costs)
    assert on_gpu.per_layer[1].compute_s == pytest.approx(1.5625e-6)
    # the profile's table is the default; without a precision map every tensor is plain
    table = replace(PROFILE, kernel_costs=costs)
    assert predict_speed(sized, {"": "cpu"}, table, precisions={"1": "int8"}).decode_s == (
        pytest.approx(prediction.decode_s)
    )
    assert predict_speed(sized, {"": "cpu"}, table).per_layer[1].compute_s == pytest.approx(2.5e-5)


def test_documented_table_and_kinds() -> None:
    assert [precision_kind(p) for p in ("int4-g64", "nf4-dq", "fp8", "bf16", "fp32")] == [
        "int4",
        "nf4",
        "fp8",
        "plain",
        "plain",
    ]
    assert DEFAULT_KERNEL_COSTS.efficiency(0, "int8") == 0.785  # torchao's H100 table
    assert DEFAULT_KERNEL_COSTS.efficiency("cpu", "float16") == 1.0
    assert not DEFAULT_KERNEL_COSTS.cpu_measured
    again = KernelCosts.from_dict(DEFAULT_KERNEL_COSTS.to_dict())
    assert again == DEFAULT_KERNEL_COSTS
    with pytest.raises(ValueError, match="above 0"):
        KernelCosts.from_dict({"cpu": {"int8": 0}})


def with_sizes(tree, sizes):
    from workbench.runtime.precision_planning import with_tensor_sizes

    return with_tensor_sizes(tree, {**tree.tensor_nbytes, **sizes})


def test_the_hosts_dispatch_adds_on_the_cpu_and_is_a_floor_on_a_gpu(toy_tree) -> None:
    profile = replace(PROFILE, module_call_us=100.0, forward_call_us=1000.0)
    on_cpu = predict_speed(toy_tree, {"": "cpu"}, profile, prompt_tokens=100)
    # each Linear is one module call: 1e-4 s; its work max(2e6 / 5e11, 2e6 / 4e10) = 5e-5 s
    first, _ = on_cpu.per_layer
    assert first.dispatch_s == pytest.approx(1e-4)
    assert first.compute_s == pytest.approx(5e-5 + 1e-4)  # the same cores do both
    assert on_cpu.decode_s == pytest.approx(2 * 1.5e-4 + 1e-3)  # + one forward's 1 ms
    # prefill: max(2e8 / 5e11, 5e-5) = 4e-4 s of work per layer, dispatched once
    assert on_cpu.prefill_s == pytest.approx(2 * (4e-4 + 1e-4) + 1e-3)
    assert on_cpu.bottleneck == "dispatch"  # 1.2 ms of the 1.3 ms step is the host's
    on_gpu = predict_speed(toy_tree, {"": 0}, profile)
    # the GPU's 2.5e-6 s per layer hides behind the host's 1e-4 s of launches
    assert on_gpu.per_layer[0].compute_s == pytest.approx(1e-4)
    assert on_gpu.decode_s == pytest.approx(2 * 1e-4 + 1e-3)
    assert on_gpu.bottleneck == "dispatch"
    without = predict_speed(toy_tree, {"": 0}, PROFILE)
    assert without.bottleneck == "memory" and without.per_layer[0].dispatch_s == 0


def test_a_transformer_layer_dispatches_its_leaf_modules(demo_llama_dir) -> None:
    opened = open_model(demo_llama_dir)
    profile = replace(PROFILE, module_call_us=10.0)
    layers = {layer.name: layer for layer in predict_speed(opened, {"": "cpu"}, profile).per_layer}
    # q, k, v, o, gate, up, down, the activation and two norms: 10 calls of 10 us
    assert layers["model.layers.0"].dispatch_s == pytest.approx(10 * 10e-6)
    assert layers["model.embed_tokens"].dispatch_s == pytest.approx(10e-6)
