"""Checkpoint loading: workbench vs accelerate vs a raw read of the same bytes.

Sizes: a Llama-shaped fp16 checkpoint (hidden 2048, intermediate 5632, 17 layers, vocab 32000,
untied head: 1.005 B parameters = 2.01 GB) in 5 safetensors shards, generated once (seeded) and
cached under ``~/.cache/workbench-bench/llama-2g``. Every measurement runs in a fresh process
(imports done before the clock starts; the peak-RSS mark is reset just before the load through
``/proc/self/clear_refs``); figures are medians over ``--runs`` runs. The page cache is warm (the
files were just written or read), so this measures the loader, not the disk.

Scenarios:
  raw        read every shard into preallocated buffers (the floor for an eager load)
  cpu        load to ``{"": "cpu"}``: workbench (default ``mmap=True``: copy-on-write maps of the
             files) vs accelerate ``load_checkpoint_in_model`` (also maps them, then gc.collect)
  cpu-eager  workbench with ``mmap=False``: every byte read now into private memory (vs raw)
  auto-disk  ``load_checkpoint_and_dispatch(device_map="auto", max_memory={"cpu": "0.75GiB"})``,
             forcing most layers to disk: time, bytes in the offload folder, peak RSS
  --device cuda adds ``{"": 0}`` (workbench vs accelerate).

Usage: python benchmarks/bench_loading.py [--runs 3] [--device cuda] [--only cpu,auto-disk]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CACHE = (
    Path(os.environ.get("WORKBENCH_BENCH_CACHE", Path.home() / ".cache" / "workbench-bench"))
    / "llama-2g"
)
CONFIG = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 17,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "max_position_embeddings": 2048,
}
GIB = 2**30


def build_meta_model(engine: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if engine == "accelerate":
        from accelerate import init_empty_weights
    else:
        from workbench.big_modeling import init_empty_weights
    with init_empty_weights():
        model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    return model.to(torch.float16)


def ensure_checkpoint() -> Path:
    if (CACHE / "model.safetensors.index.json").is_file():
        return CACHE
    import torch

    from workbench.big_modeling.shards import save_sharded_checkpoint

    print(f"generating the checkpoint in {CACHE} (once) ...", flush=True)
    model = build_meta_model("workbench")
    generator = torch.Generator().manual_seed(0)
    state = {}
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point():
            state[name] = (torch.randn(tensor.shape, generator=generator) * 0.02).to(torch.float16)
    CACHE.mkdir(parents=True, exist_ok=True)
    save_sharded_checkpoint(state, CACHE, num_shards=5)
    return CACHE


# ----------------------------------------------------------------------------------------------
# child side: one measurement per process
# ----------------------------------------------------------------------------------------------


def _peak_rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _wchar() -> int:
    with open("/proc/self/io") as io:
        for line in io:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def _folder_nbytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def child(mode: str, folder: Path, device: str) -> dict[str, float]:
    import psutil
    import torch

    engine, scenario = mode.split(":")
    process = psutil.Process()
    offload = Path(tempfile.mkdtemp(prefix="bench-offload-"))
    try:
        if engine == "raw":
            files = sorted(folder.glob("*.safetensors"))
            torch.ones(1)
            _reset_peak()
            rss_before, wchar_before, start = (
                process.memory_info().rss,
                _wchar(),
                time.perf_counter(),
            )
            buffers = []
            for file in files:
                buffer = torch.empty(file.stat().st_size, dtype=torch.uint8)
                with open(file, "rb", buffering=0) as handle:
                    view, done = memoryview(buffer.numpy()), 0
                    while done < len(view):
                        done += handle.readinto(view[done:])
                buffers.append(buffer)
        else:
            model = build_meta_model(engine)
            if engine == "accelerate":
                import accelerate as api
            else:
                import workbench.big_modeling as api
            # resolve (and so import) the functions before the clock starts, for both engines
            load_in_model, load_and_dispatch = (
                api.load_checkpoint_in_model,
                api.load_checkpoint_and_dispatch,
            )
            target = {"": 0} if scenario == "cuda" else {"": "cpu"}
            _reset_peak()
            rss_before, wchar_before, start = (
                process.memory_info().rss,
                _wchar(),
                time.perf_counter(),
            )
            if scenario == "cpu-eager":
                load_in_model(model, str(folder), device_map=target, mmap=False)
            elif scenario in ("cpu", "cuda"):
                load_in_model(model, str(folder), device_map=target)
                if scenario == "cuda":
                    torch.cuda.synchronize()
            else:
                model = load_and_dispatch(
                    model,
                    str(folder),
                    device_map="auto",
                    max_memory={"cpu": int(0.75 * GIB)},
                    no_split_module_classes=["LlamaDecoderLayer"],
                    offload_folder=str(offload),
                )
        load_s = time.perf_counter() - start
        figures = {
            "load_s": load_s,
            "peak_rss": _peak_rss(),
            "rss_growth": process.memory_info().rss - rss_before,
            "peak_extra": _peak_rss() - process.memory_info().rss,
            "wchar": _wchar() - wchar_before,
            "offload_nbytes": _folder_nbytes(offload),
        }
        if scenario == "cuda":
            figures["cuda_peak"] = torch.cuda.max_memory_allocated()
        device_map = getattr(model, "hf_device_map", {}) if engine != "raw" else {}
        figures["disk_entries"] = sum(1 for d in device_map.values() if d == "disk")
        figures["cpu_entries"] = sum(1 for d in device_map.values() if d == "cpu")
        return figures
    finally:
        shutil.rmtree(offload, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# parent side
# ----------------------------------------------------------------------------------------------


def measure(mode: str, folder: Path, runs: int, device: str) -> dict[str, float] | None:
    samples = []
    for _ in range(runs):
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                mode,
                "--folder",
                str(folder),
                "--device",
                device,
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            print(f"  {mode}: failed\n{done.stderr[-2000:]}")
            return None
        samples.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}


def _fmt(figures: dict[str, float] | None) -> str:
    if figures is None:
        return "n/a"
    return (
        f"{figures['load_s']:7.3f} s  peak RSS {figures['peak_rss'] / GIB:5.2f} GiB"
        f"  (+{figures['rss_growth'] / GIB:5.2f} GiB kept, peak-after {figures['peak_extra'] / 2**20:6.1f} MiB)"
        f"  offload folder {figures['offload_nbytes'] / GIB:5.2f} GiB"
        + (
            f"  map: {figures['cpu_entries']:.0f} cpu / {figures['disk_entries']:.0f} disk entries"
            if figures["disk_entries"]
            else ""
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--only", default="raw,cpu,cpu-eager,auto-disk")
    parser.add_argument("--child")
    parser.add_argument("--folder")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, Path(args.folder), args.device)))
        return
    folder = ensure_checkpoint()
    try:
        import accelerate  # noqa: F401

        has_accelerate = True
    except ImportError:
        has_accelerate = False
    total = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    print(
        f"checkpoint: {folder} ({total / 1e9:.2f} GB, 5 shards, fp16); median of {args.runs} fresh processes"
    )
    print(
        f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (shared; expect noise)"
    )
    scenarios = args.only.split(",")
    if args.device == "cuda":
        scenarios.append("cuda")
    for scenario in scenarios:
        print(f"\n== {scenario}")
        if scenario == "raw":
            print(f"  raw read     {_fmt(measure('raw:read', folder, args.runs, args.device))}")
            continue
        ours = measure(f"workbench:{scenario}", folder, args.runs, args.device)
        print(f"  workbench    {_fmt(ours)}")
        if scenario == "cpu-eager":
            continue  # workbench only: every byte read into private memory (compare with raw)
        if not has_accelerate:
            print("  accelerate   not installed")
            continue
        theirs = measure(f"accelerate:{scenario}", folder, args.runs, args.device)
        print(f"  accelerate   {_fmt(theirs)}")
        if ours and theirs:
            print(
                f"  ratio: {theirs['load_s'] / ours['load_s']:.1f}x faster, peak RSS {ours['peak_rss'] / theirs['peak_rss']:.2f}x of accelerate's, "
                f"offload folder {ours['offload_nbytes'] / 2**20:.1f} MiB vs {theirs['offload_nbytes'] / 2**20:.1f} MiB"
            )


if __name__ == "__main__":
    main()
