"""Disk-offloaded forward: ours (with and without prefetch) against accelerate and the floors.

Model: 24 x Linear(4096, 4096) fp32 (24 * 64 MiB = 1.6 GB of weights), batch 8, forward under
no_grad. All weights live in one offload folder (raw memory-mapped ``.dat`` files plus
``index.json``, a format accelerate reads too), so both libraries read the same bytes.

Floors, measured in every round:
- compute: the same forward with every weight in RAM (or on the GPU with ``--device cuda``);
- IO: total bytes / bandwidth of one sequential pass over the files in layer order, by the
  faster of two readers: ``readinto`` into a reused buffer, and a memory map populated with
  ``madvise(MADV_POPULATE_READ)`` (the faster one on our 2-core VM). Warm: from the page cache;
  cold: after ``posix_fadvise(DONTNEED)`` on every file.
Target: <= 1.2 x max(compute, IO). Accelerate reference: 0.86 s against floors 0.23 / 0.35 s.

Each candidate runs three forwards in a row per round:
- reopen: the files are in the page cache but the maps our weights maps hold open were closed
  (by the previous candidate's cold run), so every page is faulted in again: the first forward
  after a load or after ``mapped_files.clear()``;
- warm: the next forward, the steady state of a model used again and again;
- cold: below.

Cold is cold: before each cold forward (and the IO floors) every prefetcher drops what it fetched
ahead for the next forward (``Prefetcher.discard()``) and our weights maps close the file maps
they hold open between forwards (pages that are mapped cannot be dropped from the page cache),
and the share of the files each cold forward read from storage
(``/proc/self/io``) is printed.

Candidates (built once, then timed round-robin so background load hits all alike):
ours without prefetch (zero-copy memory maps), ours+prefetch (default: a reader thread
populates the next modules' memory maps), ours+advise (kernel read-ahead only), ours+read
(whole-file reads into buffers; CPU only) and accelerate. Ratios use the median of the rounds;
the best round is shown too.

    python benchmarks/bench_disk_offload.py [--layers 24] [--dim 4096] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from workbench.big_modeling.hooks.prefetch_reader import populate


def build_meta(layers: int, dim: int) -> nn.Sequential:
    with torch.device("meta"):
        return nn.Sequential(*[nn.Linear(dim, dim) for _ in range(layers)]).eval()


def layer_order(folder: Path) -> list[Path]:
    """The ``.dat`` files in the order the forward reads them (0.bias, 0.weight, 1.bias...)."""
    return sorted(folder.glob("*.dat"), key=lambda p: (int(p.name.split(".")[0]), p.name))


def drop_cache(files: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def storage_read_bytes() -> int:
    """Bytes this process caused to be read from storage (0 where /proc/self/io is missing)."""
    try:
        with open("/proc/self/io") as handle:
            for line in handle:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def read_by_readinto(files: list[Path], buffer: memoryview) -> None:
    for path in files:
        size = path.stat().st_size
        with open(path, "rb", buffering=0) as handle:
            filled = 0
            while filled < size:
                count = handle.readinto(buffer[filled:size])
                if not count:
                    raise OSError(f"{path}: ends after {filled} of {size} B")
                filled += count


def read_by_map(files: list[Path]) -> None:
    for path in files:
        size = path.stat().st_size
        if size:
            populate(torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8))


def time_io(read: Callable[[], None], files: list[Path], cold: bool) -> float:
    if cold:
        drop_cache(files)
    start = time.perf_counter()
    read()
    return time.perf_counter() - start


def discard_prefetches(models: list[nn.Module]) -> None:
    """Make every model drop what it fetched ahead and close the maps its weights map holds open.

    Pages that are mapped cannot be dropped from the page cache, so a cold run needs both.
    """
    for model in models:
        prefetcher = getattr(model, "_wb_prefetcher", None)
        if prefetcher is not None:
            prefetcher.discard()
        for module in model.modules():
            weights_map = getattr(getattr(module, "_hf_hook", None), "weights_map", None)
            weights_map = getattr(weights_map, "dataset", weights_map)
            held = getattr(weights_map, "mapped_files", None)
            if held is not None:
                held.clear()


def time_forward(model: nn.Module, x, files: list[Path] | None, device) -> tuple[float, int, float]:
    """Seconds of one forward, bytes read from storage and seconds waited for the prefetcher.

    ``files`` given: run it cold (the caller discards prefetches first).
    """
    prefetcher = getattr(model, "_wb_prefetcher", None)
    if files is not None:
        drop_cache(files)
    waited_before = getattr(prefetcher, "wait_s", 0.0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    read_before = storage_read_bytes()
    start = time.perf_counter()
    with torch.no_grad():
        model(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    waited = getattr(prefetcher, "wait_s", 0.0) - waited_before
    return seconds, storage_read_bytes() - read_before, waited


def _prefetching(model: nn.Module, disk_reads: str) -> nn.Module:
    from workbench.big_modeling.hooks.prefetch import enable_prefetch

    enable_prefetch(model, disk_reads=disk_reads)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=3, help="rounds (each: every candidate once)")
    parser.add_argument("--dir", default=None, help="where the offload folder goes (a real disk)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)

    from workbench.big_modeling.dispatch import disk_offload
    from workbench.big_modeling.offload.folder import offload_state_dict

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
        files = layer_order(folder)
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

        def meta() -> nn.Module:
            return build_meta(args.layers, args.dim)

        makers = {
            "ours": lambda: disk_offload(meta(), folder, device),
            "ours+prefetch": lambda: disk_offload(meta(), folder, device, prefetch=True),
        }
        if device.type == "cpu":
            for mode in ("advise", "read"):
                makers[f"ours+{mode}"] = lambda mode=mode: _prefetching(
                    disk_offload(meta(), folder, device), mode
                )
        if accelerate is not None:
            makers["accelerate"] = lambda: accelerate.disk_offload(
                meta(), str(folder), execution_device=device
            )
        models = {name: make() for name, make in makers.items()}
        exact = {"rtol": 0, "atol": 0} if device.type == "cpu" else {}
        for model in models.values():  # checks the output and teaches the prefetch order
            with torch.no_grad():
                torch.testing.assert_close(model(x), expected, **exact)

        buffer = memoryview(bytearray(max(p.stat().st_size for p in files)))
        readers = {
            "readinto": lambda: read_by_readinto(files, buffer),
            "map": lambda: read_by_map(files),
        }
        samples: dict[str, list[float]] = {}
        read_bytes: dict[str, list[int]] = {}

        def note(key: str, seconds: float) -> None:
            samples.setdefault(key, []).append(seconds)

        for _ in range(args.runs):
            note("compute", time_forward(plain, x, None, device)[0])
            discard_prefetches(list(models.values()))
            for cache in ("warm", "cold"):
                for name, read in readers.items():
                    note(f"io {cache} {name}", time_io(read, files, cold=cache == "cold"))
            for name, model in models.items():
                for cache in ("reopen", "warm", "cold"):
                    cold = files if cache == "cold" else None
                    if cold:
                        discard_prefetches(list(models.values()))
                    seconds, nread, waited = time_forward(model, x, cold, device)
                    note(f"{cache} {name}", seconds)
                    note(f"{cache} {name} waited", waited)
                    if cache == "cold":
                        read_bytes.setdefault(name, []).append(nread)

        def median(key: str) -> float:
            return statistics.median(samples[key])

        compute_s = median("compute")
        for cache in ("reopen", "warm", "cold"):
            io_cache = "warm" if cache == "reopen" else cache
            io = {name: median(f"io {io_cache} {name}") for name in readers}
            io_s = min(io.values())
            floor = max(compute_s, io_s)
            print(
                f"floors ({cache}): compute {compute_s:.3f} s, IO {io_s:.3f} s "
                f"({nbytes / io_s / 1e9:.2f} GB/s; "
                + ", ".join(f"{name} {s:.3f} s" for name, s in io.items())
                + f") -> max {floor:.3f} s"
            )
            for name, model in models.items():
                found, best = median(f"{cache} {name}"), min(samples[f"{cache} {name}"])
                line = (
                    f"{cache:6s} {name:15s} {found:.3f} s = {found / floor:5.2f} x floor "
                    f"(best {best / floor:4.2f})"
                )
                if "accelerate" in models and name != "accelerate":
                    line += f" | accelerate/this {median(f'{cache} accelerate') / found:5.2f}x"
                if hasattr(model, "_wb_prefetcher"):
                    line += f" | waited {median(f'{cache} {name} waited'):.3f} s for the reader"
                if cache == "cold" and any(read_bytes[name]):
                    line += f" | read {min(read_bytes[name]) / nbytes:4.0%} of the files"
                print(line)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
