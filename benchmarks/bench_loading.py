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

Printed per load: time, peak RSS, RSS kept, offload folder size and the bytes the process wrote
(``wchar`` from ``/proc/self/io``: ``write()`` calls only, blind to accelerate's ``np.memmap``
writes, so compare offload folders by size); ``cpu-eager`` also prints its time as a multiple of the raw
read's, ``auto-disk`` the bytes of tensor data written to the offload folder (``.dat`` files,
not ``index.json``). At ``--size 2g`` each scenario with an accelerate run ends with PASS or FAIL
against the issue's targets: >= 5x faster than accelerate, peak RSS no higher, and for
``auto-disk`` 0 bytes of tensor data written (the dtype is unchanged); the exit status is 1 when
any target fails. ``--size tiny`` (a 7.8 MB model, most layers on disk too) only checks
that the script runs.

Usage: python benchmarks/bench_loading.py [--runs 3] [--device cuda] [--only cpu,auto-disk]
       [--size 2g|tiny]
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

CACHE_ROOT = Path(
    os.environ.get("WORKBENCH_BENCH_CACHE", Path.home() / ".cache" / "workbench-bench")
)
GIB = 2**30
SIZES = {
    # 1.005 B parameters = 2.01 GB fp16; a 0.75 GiB CPU budget sends most layers to disk
    "2g": {
        "config": {
            "hidden_size": 2048,
            "intermediate_size": 5632,
            "num_hidden_layers": 17,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "vocab_size": 32000,
            "tie_word_embeddings": False,
            "max_position_embeddings": 2048,
        },
        "cpu_budget": int(0.75 * GIB),
    },
    # 3.88 M parameters = 7.77 MB fp16; a 2.4 MB CPU budget (~30%) sends most layers to disk
    "tiny": {
        "config": {
            "hidden_size": 128,
            "intermediate_size": 344,
            "num_hidden_layers": 17,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "vocab_size": 2000,
            "tie_word_embeddings": False,
            "max_position_embeddings": 256,
        },
        "cpu_budget": 2_400_000,
    },
}
TARGET_SPEEDUP = 5.0


def build_meta_model(engine: str, size: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if engine == "accelerate":
        from accelerate import init_empty_weights
    else:
        from workbench.big_modeling import init_empty_weights
    with init_empty_weights():
        model = LlamaForCausalLM(LlamaConfig(**SIZES[size]["config"]))
    return model.to(torch.float16)


def ensure_checkpoint(size: str) -> Path:
    cache = CACHE_ROOT / f"llama-{size}"
    if (cache / "model.safetensors.index.json").is_file():
        return cache
    import torch

    from workbench.big_modeling.loading.writer import save_sharded_checkpoint

    print(f"generating the checkpoint in {cache} (once) ...", flush=True)
    model = build_meta_model("workbench", size)
    generator = torch.Generator().manual_seed(0)
    state = {}
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point():
            state[name] = (torch.randn(tensor.shape, generator=generator) * 0.02).to(torch.float16)
    cache.mkdir(parents=True, exist_ok=True)
    save_sharded_checkpoint(state, cache, num_shards=5)
    return cache


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


def _folder_nbytes(folder: Path, *, data_only: bool = False) -> int:
    return sum(
        p.stat().st_size
        for p in folder.rglob("*")
        if p.is_file() and not (data_only and p.name == "index.json")
    )


def child(mode: str, folder: Path, device: str, size: str) -> dict[str, float]:
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
            model = build_meta_model(engine, size)
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
                    max_memory={"cpu": SIZES[size]["cpu_budget"]},
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
            "offload_data_nbytes": _folder_nbytes(offload, data_only=True),
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


def measure(mode: str, folder: Path, runs: int, device: str, size: str) -> dict[str, float] | None:
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
                "--size",
                size,
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
        f"  wrote {figures['wchar'] / 2**20:8.1f} MiB (wchar)"
        + (
            f"  map: {figures['cpu_entries']:.0f} cpu / {figures['disk_entries']:.0f} disk entries"
            if figures["disk_entries"]
            else ""
        )
    )


def _verdict(scenario: str, ours: dict[str, float], theirs: dict[str, float]) -> list[str]:
    """The issue's targets this scenario misses (empty: PASS)."""
    failed = []
    speedup = theirs["load_s"] / ours["load_s"]
    if speedup < TARGET_SPEEDUP:
        failed.append(f"{speedup:.1f}x faster < {TARGET_SPEEDUP:.0f}x")
    if ours["peak_rss"] > theirs["peak_rss"]:
        failed.append(
            f"peak RSS {ours['peak_rss'] / GIB:.2f} GiB > accelerate's {theirs['peak_rss'] / GIB:.2f} GiB"
        )
    if scenario == "auto-disk" and ours["offload_data_nbytes"] > 0:
        failed.append(f"{ours['offload_data_nbytes']:.0f} B of tensor data written, not 0")
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--only", default="raw,cpu,cpu-eager,auto-disk")
    parser.add_argument("--size", default="2g", choices=sorted(SIZES))
    parser.add_argument("--child")
    parser.add_argument("--folder")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, Path(args.folder), args.device, args.size)))
        return
    folder = ensure_checkpoint(args.size)
    try:
        import accelerate  # noqa: F401

        has_accelerate = True
    except ImportError:
        has_accelerate = False
    total = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    print(
        f"checkpoint: {folder} ({total / 1e9:.3f} GB, 5 shards, fp16); median of {args.runs} fresh processes"
    )
    print(
        f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (shared; expect noise)"
    )
    scenarios = args.only.split(",")
    if "cpu-eager" in scenarios and "raw" not in scenarios:
        scenarios.insert(0, "raw")  # cpu-eager is quoted against the raw read
    if args.device == "cuda":
        scenarios.append("cuda")
    check_targets = args.size == "2g"
    raw: dict[str, float] | None = None
    failures: list[str] = []
    for scenario in scenarios:
        print(f"\n== {scenario}")
        if scenario == "raw":
            raw = measure("raw:read", folder, args.runs, args.device, args.size)
            print(f"  raw read     {_fmt(raw)}")
            continue
        ours = measure(f"workbench:{scenario}", folder, args.runs, args.device, args.size)
        print(f"  workbench    {_fmt(ours)}")
        if ours and raw and scenario in ("cpu", "cpu-eager"):
            print(
                f"  vs raw read: {ours['load_s'] / raw['load_s']:.2f}x the raw read's time, "
                f"peak RSS {ours['peak_rss'] / raw['peak_rss']:.2f}x"
            )
        if ours and scenario == "auto-disk":
            print(f"  workbench: {ours['offload_data_nbytes']:.0f} bytes of tensor data written")
        if scenario == "cpu-eager":
            continue  # workbench only: every byte read into private memory (compare with raw)
        if not has_accelerate:
            print("  accelerate   not installed")
            continue
        theirs = measure(f"accelerate:{scenario}", folder, args.runs, args.device, args.size)
        print(f"  accelerate   {_fmt(theirs)}")
        if not (ours and theirs):
            continue
        print(
            f"  ratio: {theirs['load_s'] / ours['load_s']:.1f}x faster, peak RSS {ours['peak_rss'] / theirs['peak_rss']:.2f}x of accelerate's, "
            f"offload folder {ours['offload_nbytes'] / 2**20:.1f} MiB vs {theirs['offload_nbytes'] / 2**20:.1f} MiB"
        )
        if scenario == "auto-disk":
            print(
                f"  tensor data written: {ours['offload_data_nbytes']:.0f} B vs accelerate's "
                f"{theirs['offload_data_nbytes']:.0f} B; write() calls {ours['wchar'] / 2**20:.1f} MiB "
                f"vs {theirs['wchar'] / 2**20:.1f} MiB (wchar, blind to accelerate's np.memmap writes)"
            )
        if not check_targets:
            print(f"  targets: not checked at --size {args.size}")
            continue
        failed = _verdict(scenario, ours, theirs)
        print(f"  targets: {'PASS' if not failed else 'FAIL: ' + '; '.join(failed)}")
        failures += [f"{scenario}: {reason}" for reason in failed]
    if failures:
        print("\nFAIL " + " | ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
