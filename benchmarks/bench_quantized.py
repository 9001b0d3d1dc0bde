"""Quantized loads on the CPU: bytes per device, predicted vs measured, and decode tok/s vs bf16.

Model: a demo Llama (``workbench make-demo --params 200M``, bf16, random weights) loaded with our
engine along two device maps: ``cpu`` (everything in RAM) and ``cpu+disk`` (the second half of
the decoder layers on disk). Precision maps: ``{"": "bfloat16", "model.layers": P}`` for each
precision ``P`` (embeddings, norms and ``lm_head`` stay bf16). torchao quantizes (int8:
``Int8Tensor``; int4: ``Int4OpaqueTensor``, the CPU tinygemm layout; fp8: ``Float8Tensor``).

Bytes: predicted per device = ``quantization.sizes.tensor_nbytes_under`` over the tensors the map
sends there (what the planner uses); measured = cpu: the bytes the model's tensors hold (torchao
inner tensors for packed weights); disk: the tensor data in the offload folder's packed
safetensors files plus the checkpoint ranges the index points into.

Speed: greedy decode with a KV cache, ``--tokens`` tokens after a ``--prompt``-token prefill
(prefill not timed), median of ``--rounds`` rounds run round-robin over the candidates so
background load hits all alike; the ratio is against bf16 on the same map in the same run.

Predicted: ``models.speed.predict_speed`` of the same map and precisions on this machine's
detected profile, with the CPU kernel probe (``device_probe.cached_cpu_kernels``: measured once
per machine, cached; its figures are printed) setting the CPU's bf16 read rate and each format's
kernel efficiency; ``pred/meas`` is the speed model's error. The disk read rate is the typical
2 GB/s (not measured), and the decode loop rereads the offload files from the page cache, so the
``cpu+disk`` rows predict low.

    python benchmarks/bench_quantized.py [--folder DEMO] [--precisions bf16,int8,int4-g64]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import struct
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from workbench.big_modeling import init_empty_weights, load_checkpoint_and_dispatch
from workbench.big_modeling.device_map.value import device_for
from workbench.big_modeling.quantization.packed import stored_nbytes
from workbench.big_modeling.quantization.precisions import parse_precisions
from workbench.big_modeling.quantization.sizes import QuantizableWeights, tensor_nbytes_under
from workbench.models.demo import make_demo
from workbench.models.hardware import HardwareProfile, detect_hardware
from workbench.models.intake import open_model
from workbench.models.kernel_costs import MEMORY_BANDWIDTH_UTILIZATION
from workbench.models.speed import predict_speed
from workbench.runtime.precision_planning import with_tensor_sizes


def empty_model(folder: Path) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(folder)
    with init_empty_weights():
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()


def device_maps(layers: int) -> dict[str, dict[str, str]]:
    cpu = {"": "cpu"}
    split = {"": "cpu", **{f"model.layers.{i}": "disk" for i in range(layers // 2, layers)}}
    return {"cpu": cpu, "cpu+disk": split}


def planned_tensors(model: torch.nn.Module) -> dict[str, int]:
    """Planning bytes per tensor (parameters and persistent buffers), as the module tree has them."""
    sizes = {name: p.numel() * p.element_size() for name, p in model.named_parameters()}
    for module_name, module in model.named_modules():
        for attr, buffer in module._buffers.items():
            if buffer is not None and attr not in module._non_persistent_buffers_set:
                name = f"{module_name}.{attr}" if module_name else attr
                sizes[name] = buffer.numel() * buffer.element_size()
    return sizes


def predicted_per_device(
    folder: Path, precision_map: dict[str, str], device_map: dict[str, str]
) -> dict[str, int]:
    model = empty_model(folder)
    sizes = tensor_nbytes_under(precision_map, planned_tensors(model), QuantizableWeights.of(model))
    totals: dict[str, int] = {}
    for name, nbytes in sizes.items():
        device = str(device_for(name, device_map))
        totals[device] = totals.get(device, 0) + nbytes
    return totals


def safetensors_ranges(path: Path) -> dict[str, int]:
    with path.open("rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_len))
    return {
        key: info["data_offsets"][1] - info["data_offsets"][0]
        for key, info in header.items()
        if key != "__metadata__"
    }


def measured_per_device(model: torch.nn.Module, offload: Path | None) -> dict[str, int]:
    cpu = 0
    names = planned_tensors(model)
    state = dict(model.named_parameters())
    for module_name, module in model.named_modules():
        for attr, buffer in module._buffers.items():
            if buffer is not None:
                state[f"{module_name}.{attr}" if module_name else attr] = buffer
    for name in names:
        tensor = state[name]
        if tensor.device.type == "cpu":
            cpu += stored_nbytes(tensor)
    totals = {"cpu": cpu}
    if offload is not None:
        index = json.loads((offload / "index.json").read_text())
        ranges: dict[str, dict[str, int]] = {}
        disk = 0
        for info in index.values():
            file = info.get("safetensors_file")
            if file is None:
                continue
            if file not in ranges:
                ranges[file] = safetensors_ranges(Path(file))
            disk += ranges[file][info["weight_name"]]
        totals["disk"] = disk
    return totals


def predicted_tok_s(
    folder: Path,
    precision_map: dict[str, str],
    device_map: dict[str, str],
    profile: HardwareProfile,
) -> float:
    """The speed model's decode tok/s for this map at these precisions (quantized sizes, and
    each quantized Linear weight read by its format's kernel)."""
    opened = open_model(folder)
    weights = QuantizableWeights.of(opened.model)
    sizes = tensor_nbytes_under(precision_map, opened.tree.tensor_nbytes, weights)
    quantized = precision_map["model.layers"]
    kernels = {
        tensor.rpartition(".")[0]: quantized
        for tensor in weights.shapes
        if tensor.startswith("model.layers.")
    }
    return predict_speed(
        with_tensor_sizes(opened.tree, sizes), device_map, profile, precisions=kernels
    ).tokens_per_s


def decode_tok_s(model: torch.nn.Module, prompt: int, tokens: int) -> float:
    ids = torch.arange(1, prompt + 1).unsqueeze(0)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True)
        cache, next_id = out.cache, out.logits[:, -1:].argmax(-1)  # transformers 5: `cache`
        start = time.perf_counter()
        for _ in range(tokens):
            out = model(input_ids=next_id, cache=cache, use_cache=True)
            cache, next_id = out.cache, out.logits[:, -1:].argmax(-1)
        return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, help="demo folder (made at 200M if missing)")
    parser.add_argument("--precisions", default="bf16,int8,int4-g64")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-quantized-"))
    try:
        folder = args.folder or work / "demo"
        if not (folder / "config.json").is_file():
            make_demo(folder, params="200M", shards=4, dtype="bfloat16")
        config = AutoConfig.from_pretrained(folder)
        params = sum(p.numel() for p in empty_model(folder).parameters())
        print(
            f"model: demo llama {params / 1e6:.0f}M params, hidden {config.hidden_size}, "
            f"{config.num_hidden_layers} layers, bf16; torch threads {torch.get_num_threads()}"
        )
        maps = device_maps(config.num_hidden_layers)
        candidates = {}
        print("\nbytes per device (MiB), predicted (planner sizes) vs measured")
        print(
            f"{'map':9} {'precision':10} {'dev':5} {'predicted':>10} {'measured':>10} {'diff B':>8}"
        )
        for map_name, device_map in maps.items():
            for precision in parse_precisions(args.precisions):
                precision_map = {"": "bfloat16", "model.layers": precision.name}
                offload = work / f"off-{map_name}-{precision.name}"
                start = time.perf_counter()
                model = load_checkpoint_and_dispatch(
                    empty_model(folder),
                    folder,
                    device_map=device_map,
                    offload_folder=offload if "disk" in device_map.values() else None,
                    precision_map=precision_map,
                )
                load_s = time.perf_counter() - start
                predicted = predicted_per_device(folder, precision_map, device_map)
                measured = measured_per_device(model, offload if offload.exists() else None)
                for device in sorted(predicted):
                    p, m = predicted[device], measured.get(device, 0)
                    print(
                        f"{map_name:9} {precision.name:10} {device:5} {p / 2**20:10.2f} "
                        f"{m / 2**20:10.2f} {m - p:8d}"
                    )
                candidates[(map_name, precision.name)] = (model, load_s)
        speeds: dict[tuple[str, str], list[float]] = {key: [] for key in candidates}
        for _ in range(args.rounds):
            for key, (model, _load_s) in candidates.items():
                speeds[key].append(decode_tok_s(model, args.prompt, args.tokens))
        print(
            f"\ndecode tok/s ({args.tokens} tokens after a {args.prompt}-token prompt, "
            f"median of {args.rounds} rounds)"
        )
        profile = detect_hardware(measure_links=False, measure_kernels=True)
        costs = profile.kernel_costs
        print(
            f"speed model: {'measured' if costs.cpu_measured else 'documented'} CPU kernels, "
            f"bf16 read {profile.device('cpu').memory_bandwidth_gbps * MEMORY_BANDWIDTH_UTILIZATION:.3g} GB/s, "
            + ", ".join(
                f"{kind} {value:.3g}" for kind, value in costs.cpu.items() if kind != "plain"
            )
            + " of it"
        )
        print(
            f"{'map':9} {'precision':10} {'tok/s':>7} {'vs bf16':>8} {'load s':>7} "
            f"{'predicted':>9} {'pred/meas':>9}"
        )
        for (map_name, name), values in speeds.items():
            median = statistics.median(values)
            base = (
                statistics.median(speeds[(map_name, "bfloat16")])
                if (map_name, "bfloat16") in speeds
                else median
            )
            precision_map = {"": "bfloat16", "model.layers": name}
            predicted = predicted_tok_s(folder, precision_map, maps[map_name], profile)
            print(
                f"{map_name:9} {name:10} {median:7.2f} {median / base:7.2f}x "
                f"{candidates[(map_name, name)][1]:7.1f} {predicted:9.2f} {predicted / median:8.2f}x"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
