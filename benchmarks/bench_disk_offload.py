"""Disk-offloaded forward: ours (with and without prefetch) against accelerate and the floors.

Model: 24 x Linear(4096, 4096) fp32 (24 * 64 MiB = 1.6 GB of weights), batch 8, forward under
no_grad. All weights live in one offload folder (raw memory-mapped ``.dat`` files plus
``index.json``, a format accelerate reads too), so both libraries read the same bytes.

Floors, measured in the same run:
- compute: the same forward with every weight in RAM (or on the GPU with ``--device cuda``);
- IO: total bytes / read bandwidth measured by reading the files (warm: from the page cache;
  cold: after ``posix_fadvise(DONTNEED)`` on every file).
Target: <= 1.2 x max(compute, IO). Accelerate reference: 0.86 s against floors 0.23 / 0.35 s.

Candidates: ours without prefetch (zero-copy memory maps), ours+prefetch (default: kernel
read-ahead of the next modules on a reader thread), ours+read (the reader thread reads files
whole into buffers; CPU only) and accelerate.

    python benchmarks/bench_disk_offload.py [--layers 24] [--dim 4096] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn


def build_meta(layers: int, dim: int) -> nn.Sequential:
    with torch.device("meta"):
        return nn.Sequential(*[nn.Linear(dim, dim) for _ in range(layers)]).eval()


def drop_cache(files: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_all_s(files: list[Path], cold: bool) -> float:
    """Seconds to read every file once into a reused buffer."""
    buffer = bytearray(max(p.stat().st_size for p in files))
    view = memoryview(buffer)
    if cold:
        drop_cache(files)
    start = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as handle:
            handle.readinto(view[: path.stat().st_size])
    return time.perf_counter() - start


def time_forward(model, x, runs: int, files: list[Path] | None, device: torch.device) -> float:
    """Median seconds of ``runs`` forwards; ``files`` given: drop them from the cache each time."""
    samples = []
    with torch.no_grad():
        for _ in range(runs):
            if files is not None:
                drop_cache(files)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            model(x)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _reading(model: nn.Module) -> nn.Module:
    from workbench.big_modeling.prefetch import enable_prefetch

    enable_prefetch(model, disk_reads="read")
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dir", default=None, help="where the offload folder goes (a real disk)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)

    from workbench.big_modeling.dispatch import disk_offload
    from workbench.big_modeling.offload import offload_state_dict

    try:
        import accelerate
    except ImportError:
        accelerate = None

    torch.manual_seed(0)
    state = {}
    for i in range(args.layers):
        state[f"{i}.weight"] = torch.randn(args.dim, args.dim) * (args.dim**-0.5)
        state[f"{i}.bias"] = torch.randn(args.dim) * 0.01
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    x = torch.randn(args.batch, args.dim, device=device)
    folder = Path(tempfile.mkdtemp(prefix="bench-offload-", dir=args.dir))
    try:
        offload_state_dict(folder, state)
        files = sorted(folder.glob("*.dat"))
        plain = build_meta(args.layers, args.dim).to_empty(device="cpu")
        plain.load_state_dict(state, assign=True)
        del state
        plain.to(device)
        print(
            f"model: {args.layers} x Linear({args.dim}) fp32 = {nbytes / 1e9:.2f} GB, batch "
            f"{args.batch}, execution device {device}, torch {torch.__version__}, threads "
            f"{torch.get_num_threads()}"
            + (f", accelerate {accelerate.__version__}" if accelerate else ", no accelerate")
        )
        with torch.no_grad():
            expected = plain(x)
        compute_s = time_forward(plain, x, args.runs, None, device)
        del plain
        floors = {}
        for cache in ("warm", "cold"):
            read_all_s(files, cold=False)  # warm the cache (and the buffer)
            io_s = min(read_all_s(files, cold=cache == "cold") for _ in range(2))
            floors[cache] = io_s
            print(
                f"floors ({cache}): compute {compute_s:.3f} s, IO {io_s:.3f} s "
                f"({nbytes / io_s / 1e9:.2f} GB/s) -> max {max(compute_s, io_s):.3f} s"
            )

        candidates = {
            "ours": lambda: disk_offload(build_meta(args.layers, args.dim), folder, device),
            "ours+prefetch": lambda: disk_offload(
                build_meta(args.layers, args.dim), folder, device, prefetch=True
            ),
        }
        if device.type == "cpu":
            candidates["ours+read"] = lambda: _reading(
                disk_offload(build_meta(args.layers, args.dim), folder, device)
            )
        if accelerate is not None:
            candidates["accelerate"] = lambda: accelerate.disk_offload(
                build_meta(args.layers, args.dim), str(folder), execution_device=device
            )
        results: dict[str, dict[str, float]] = {}
        for name, make in candidates.items():
            model = make()
            exact = {"rtol": 0, "atol": 0} if device.type == "cpu" else {}
            with torch.no_grad():
                torch.testing.assert_close(model(x), expected, **exact)
            warm = time_forward(model, x, args.runs, None, device)
            cold = time_forward(model, x, max(1, args.runs - 1), files, device)
            results[name] = {"warm": warm, "cold": cold}
            del model
        for cache in ("warm", "cold"):
            floor = max(compute_s, floors[cache])
            for name, found in results.items():
                line = f"{cache:4s} {name:15s} {found[cache]:.3f} s = {found[cache] / floor:5.2f} x floor"
                if "accelerate" in results and name != "accelerate":
                    line += (
                        f" | accelerate/this {results['accelerate'][cache] / found[cache]:5.2f}x"
                    )
                print(line)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
