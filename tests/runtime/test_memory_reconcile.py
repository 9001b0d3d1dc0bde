"""Predicted against measured memory: a real load and run of the demo checkpoint in a real
worker process, checked against the checkpoint's own headers; the record through the pipe."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from torch import nn

from workbench.runtime.memory_prediction import offload_staging_bytes
from workbench.runtime.memory_readings import (
    file_mapped_bytes,
    read_anonymous_bytes,
    resident_weight_bytes,
    weight_ranges,
)
from workbench.runtime.memory_record import DeviceMemory, MemoryReconciliation
from workbench.runtime.protocol import InferenceResult, LoadSummary, Result
from workbench.runtime.worker import WorkerHost

FLOAT32_NBYTES = 4  # the loads below cast the fp16 demo to float32


def _checkpoint_shapes(folder: Path) -> dict[str, list[int]]:
    """Every tensor's shape, read from the safetensors headers (no tensor data)."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shapes: dict[str, list[int]] = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(folder / shard), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                shapes[key] = list(handle.get_slice(key).get_shape())
    return shapes


def _placed_nbytes(shapes: dict[str, list[int]], device_map: dict[str, Any], device: str) -> int:
    """float32 bytes of the checkpoint tensors whose longest covering map key is ``device``."""
    total = 0
    for key, shape in shapes.items():
        covering = max((k for k in device_map if key == k or key.startswith(f"{k}.")), key=len)
        if device_map[covering] == device:
            total += FLOAT32_NBYTES * int(torch.Size(shape).numel())
    return total


@pytest.mark.slow
def test_load_and_run_in_a_worker_measure_weights_exactly(
    events: Any, demo_dir: Path, cpu_disk_map: dict[str, str], tmp_path: Path
) -> None:
    shapes = _checkpoint_shapes(demo_dir)
    cpu_nbytes = _placed_nbytes(shapes, cpu_disk_map, "cpu")
    disk_nbytes = _placed_nbytes(shapes, cpu_disk_map, "disk")
    assert cpu_nbytes > 0 and disk_nbytes > 0
    host = WorkerHost(events, offload_root=tmp_path / "offload")
    try:
        load_id = host.load(demo_dir, cpu_disk_map, dtype="float32")
        final = events.final(load_id)
        assert isinstance(final, Result), final
        summary = final.value
        assert isinstance(summary, LoadSummary)
        record = summary.memory
        assert isinstance(record, MemoryReconciliation) and record.job == "load"
        cpu, disk = record.device("cpu"), record.device("disk")
        assert cpu is not None and disk is not None
        # the worker counted its resident storages: exactly the checkpoint's CPU tensors
        assert cpu.measured_weights_bytes == cpu_nbytes
        # anonymous RSS above the idle worker holds at least the weights it loaded
        assert cpu.measured_bytes is not None and cpu.measured_bytes >= cpu_nbytes
        assert cpu.process_bytes == cpu.baseline_bytes + cpu.measured_bytes
        assert cpu.predicted_reserve_bytes == 0  # a load runs no forward
        assert disk.measured_weights_bytes == disk_nbytes  # the offload folder's .dat files
        assert disk.predicted_weights_bytes == disk_nbytes
        assert disk.read_bytes > 0  # the checkpoint was read
        assert pickle.loads(pickle.dumps(summary)) == summary  # the protocol's round trip

        infer_id = host.infer("The planner", max_new_tokens=3)
        final = events.final(infer_id)
        assert isinstance(final, Result), final
        result = final.value
        assert isinstance(result, InferenceResult) and result.memory is not None
        run = result.memory
        assert run.job == "infer"
        assert run.context_tokens == result.prompt_tokens + result.new_tokens - 1
        run_cpu, run_disk = run.device("cpu"), run.device("disk")
        assert run_cpu is not None and run_disk is not None
        assert run_cpu.measured_weights_bytes == cpu_nbytes  # disk weights went back to meta
        disk_layers = sum(1 for device in cpu_disk_map.values() if device == "disk")
        # KV cache + activations; a disk layer's weights are mapped from the offload folder
        # for its forward (file pages, no copy), so no room is predicted for them
        assert 0 < run_cpu.predicted_reserve_bytes < disk_nbytes // disk_layers
        assert run_cpu.measured_bytes is not None and run_cpu.measured_bytes >= cpu_nbytes
        # every forward read each disk layer's weights from the offload folder
        forwards = result.new_tokens
        assert run_disk.read_bytes == forwards * disk_nbytes
        assert pickle.loads(pickle.dumps(result)) == result
    finally:
        host.shutdown()


def test_resident_weights_count_each_storage_once_and_skip_non_persistent() -> None:
    model = nn.Module()
    model.embed = nn.Embedding(10, 4)  # 40 floats
    model.head = nn.Linear(4, 10, bias=False)
    model.head.weight = model.embed.weight  # tied: one storage
    model.norm = nn.LayerNorm(4)  # 4 + 4 floats
    model.register_buffer("inv_freq", torch.ones(8), persistent=False)  # not a weight
    model.register_buffer("scale", torch.ones(2))  # persistent: counted
    model.placeholder = nn.Linear(3, 3, device="meta")  # offloaded: no bytes resident
    assert resident_weight_bytes(model) == {"cpu": (40 + 4 + 4 + 2) * 4}


@pytest.mark.parametrize("dtype", [None, torch.float16])
def test_a_tied_weight_on_disk_is_measured_once(tmp_path: Path, dtype: Any) -> None:
    """Both names of a tied weight on disk point at one checkpoint tensor (as stored) or at
    hard links of one file (cast): the disk holds it once, and so it is measured (SmolLM2-135M
    all on disk measured 311 MiB where the disk holds 257)."""
    from safetensors.torch import save_file

    from workbench.big_modeling import init_empty_weights, load_checkpoint_and_dispatch
    from workbench.runtime.memory_readings import offloaded_file_bytes

    def tied() -> nn.Module:
        model = nn.Module()
        model.embed = nn.Embedding(10, 4)
        model.head = nn.Linear(4, 10, bias=False)
        model.head.weight = model.embed.weight
        model.norm = nn.LayerNorm(4)
        return model

    source = tied()
    checkpoint = tmp_path / "model.safetensors"
    state = {k: v for k, v in source.state_dict().items() if k != "head.weight"}  # as HF saves
    save_file(state, str(checkpoint))
    with init_empty_weights():
        model = tied()
    model = load_checkpoint_and_dispatch(
        model,
        str(checkpoint),
        device_map={"embed": "disk", "head": "disk", "norm": "cpu"},
        offload_folder=str(tmp_path / "offload"),
        dtype=dtype,
    )
    itemsize = 4 if dtype is None else 2
    assert offloaded_file_bytes(model) == 10 * 4 * itemsize  # the embedding, once


def test_weights_mapped_from_a_file_are_found_in_the_file_mappings(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(4096 * 3))
    mapped = torch.from_file(str(path), shared=True, size=4096 * 3, dtype=torch.uint8)
    model = nn.Module()
    model.register_buffer("from_file", mapped[4096:])  # a slice of the mapping: 8192 B
    model.register_buffer("anonymous", torch.zeros(1000, dtype=torch.uint8))
    ranges = weight_ranges(model)["cpu"]
    assert sum(end - start for start, end in ranges) == 8192 + 1000
    assert file_mapped_bytes(ranges) == 8192  # only the file-backed slice


def test_anonymous_bytes_read_from_smaps_rollup(tmp_path: Path) -> None:
    rollup = tmp_path / "smaps_rollup"
    rollup.write_text(
        "00400000-7fff0000 ---p 00000000 00:00 0    [rollup]\n"
        "Rss:              204800 kB\n"
        "Anonymous:        153600 kB\n"
        "AnonHugePages:         0 kB\n"
    )
    assert read_anonymous_bytes(str(rollup)) == 153600 * 1024
    live = read_anonymous_bytes()
    assert live is None or live > 0


def test_record_rows_and_log_line_say_predicted_beside_measured() -> None:
    record = MemoryReconciliation(
        "infer",
        (
            DeviceMemory("cuda:0", 3 * 2**20, 2**20, 3 * 2**20, 5 * 2**20),
            DeviceMemory("disk", 2**20, 0, 2**20, 2**20, read_bytes=4 * 2**20),
        ),
        context_tokens=12,
    )
    gpu = record.device("cuda:0")
    assert gpu is not None and gpu.predicted_bytes == 4 * 2**20
    assert gpu.error_fraction == pytest.approx(-0.2)  # (4 - 5) / 5
    assert gpu.rest_bytes == 2 * 2**20
    assert record.table_rows()[0] == (
        "cuda:0",
        "3 MiB",
        "3 MiB",
        "4 MiB",
        "5 MiB",
        "-20.0%",
        "-",
    )
    assert record.describe() == (
        "memory after infer (12 tokens): cuda:0 predicted 4 MiB, measured 5 MiB "
        "(-20.0%); disk predicted 1 MiB, measured 1 MiB (+0.0%), read 4 MiB"
    )
    assert DeviceMemory("cpu", 10).error_fraction is None  # nothing measured


def test_offloaded_blocks_are_staged_on_the_device_that_runs_them() -> None:
    sizes = {"embed": 10, "layers.0": 30, "layers.1": 20, "head": 5}
    gpu_map = {"embed": 0, "layers.0": "cpu", "layers.1": "disk", "head": 0}
    assert offload_staging_bytes(sizes, gpu_map) == {"cuda:0": 30}  # cpu blocks move too
    cpu_map = {"embed": "cpu", "layers.0": "cpu", "layers.1": "disk", "head": "cpu"}
    assert offload_staging_bytes(sizes, cpu_map) == {}  # disk blocks are mapped, not copied
    assert offload_staging_bytes(sizes, {"": "cpu"}) == {}


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_load_measures_cuda_allocations(
    events: Any, demo_dir: Path, demo_config: dict, tmp_path: Path
) -> None:
    layers = demo_config["num_hidden_layers"]
    device_map: dict[str, Any] = {"model.embed_tokens": 0, "model.rotary_emb": 0}
    device_map |= {f"model.layers.{i}": 0 if i < layers - 1 else "cpu" for i in range(layers)}
    device_map |= {"model.norm": 0, "lm_head": 0}
    shapes = _checkpoint_shapes(demo_dir)
    gpu_nbytes = _placed_nbytes(shapes, device_map, 0)
    cpu_nbytes = _placed_nbytes(shapes, device_map, "cpu")
    host = WorkerHost(events, offload_root=tmp_path / "offload")
    try:
        final = events.final(host.load(demo_dir, device_map, dtype="float32"))
        assert isinstance(final, Result), final
        record = final.value.memory
        gpu, cpu = record.device("cuda:0"), record.device("cpu")
        assert gpu.measured_weights_bytes == gpu_nbytes
        assert gpu.measured_bytes >= gpu_nbytes  # memory_allocated holds the weights
        assert cpu.measured_weights_bytes == cpu_nbytes  # the offload hooks' CPU state dict
        final = events.final(host.infer("The planner", max_new_tokens=3))
        assert isinstance(final, Result), final
        run_gpu = final.value.memory.device("cuda:0")
        assert run_gpu.predicted_reserve_bytes > 0
        assert run_gpu.measured_bytes > gpu_nbytes  # the peak holds KV cache and activations
    finally:
        host.shutdown()
