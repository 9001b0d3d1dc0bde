"""What a budget must leave out, measured on this machine: memory others hold, a safety
margin per backend, the host-to-device copy bandwidth (pinned and pageable), and what each
weight format's decode kernel costs on this CPU.

A GPU's budget is ``memory - held - margin``:

- *held*: what the driver and other processes already use (``torch.cuda.mem_get_info``: total
  minus free; NVML's ``used`` where ``pynvml`` is installed, the ``gpu`` extra, when it says more).
- *margin*: what a load needs beyond its tensors (``SAFETY_MARGINS`` documents each backend).

The copy bandwidth comes from a small timed copy (256 MiB, best of 3) to each GPU, cached per
device in ``<cache dir>/link-bandwidth.json`` (written atomically), so it is measured once.
Without a GPU nothing here touches CUDA: ``gpu_memory_held`` and ``cached_link_bandwidth`` are
only called for devices that exist.

The CPU kernel probe (``measure_cpu_kernels``: one-token matmuls through the loader's torchao
formats, see ``kernel_costs``) is cached per CPU model, thread count and library versions in
``<cache dir>/cpu-kernels.json``. It needs torchao, so ``detect_hardware`` only reads the cache
unless asked to measure (``measure_kernels=True``), and the joint precision planner asks.

Example:
    >>> safety_margin_bytes("cpu", 16 * 2**30)
    0
    >>> round(safety_margin_bytes(0, 24 * 2**30) / 2**30, 2)  # 0.5 GiB + 2 % of 24 GiB
    0.98
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import torch

from workbench.models.cache_dirs import (
    cached_probe,
    read_measurement_cache,
    workbench_cache_dir,
    write_measurement_cache,
)
from workbench.models.machine_load import OtherLoad
from workbench.models.probe_process import measure_apart, probe_main

logger = logging.getLogger(__name__)

MIB: Final = 2**20


@dataclass(frozen=True)
class SafetyMargin:
    """Bytes kept out of one backend's budget: ``fixed_bytes + fraction * memory``."""

    fixed_bytes: int
    fraction: float
    why: str

    def nbytes(self, memory_bytes: int) -> int:
        return int(self.fixed_bytes + self.fraction * memory_bytes)


SAFETY_MARGINS: Final[dict[str, SafetyMargin]] = {
    # CUDA context: the CUDA 12 context with cuBLAS workspaces is about 0.3-0.6 GiB under
    # lazy module loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 11.7), and PyTorch's
    # "CUDA semantics > Memory management" notes it lives outside the caching allocator, so no
    # tensor byte count sees it. The 2 % is allocator fragmentation headroom: the gap between
    # memory_reserved() and memory_allocated() the caching allocator keeps in rounded blocks
    # (vLLM leaves 10 % by default, gpu_memory_utilization=0.9, for a serving engine's pools).
    "cuda": SafetyMargin(512 * MIB, 0.02, "CUDA context 0.5 GiB + 2 % allocator fragmentation"),
    # RAM: the CPU budget of detected hardware is already "available" (reclaimable page cache
    # counted free) and the OS pages out rather than failing an allocation; no margin.
    "cpu": SafetyMargin(0, 0.0, "none (the OS pages out rather than failing)"),
    "disk": SafetyMargin(0, 0.0, "none"),
}


# Dense bf16 TFLOP/s and HBM GB/s of well-known GPUs, for detected hardware (matched by name).
KNOWN_GPUS: tuple[tuple[str, float, float], ...] = (
    ("H200", 989.0, 4800.0),
    ("H100", 989.0, 3350.0),
    ("A100", 312.0, 2039.0),
    ("L40S", 362.0, 864.0),
    ("A10", 125.0, 600.0),
    ("L4", 121.0, 300.0),
    ("T4", 65.0, 320.0),
    ("V100", 125.0, 900.0),
    ("RTX 4090", 165.0, 1008.0),
    ("RTX 3090", 71.0, 936.0),
    ("RTX 4080", 97.0, 717.0),
)


def known_gpu_speed(name: str) -> tuple[float, float] | None:
    """``(dense bf16 TFLOP/s, memory GB/s)`` of a GPU known by ``name``, else ``None``."""
    upper = name.upper()
    for key, tflops, bandwidth in KNOWN_GPUS:
        if key in upper:
            return tflops, bandwidth
    return None


def backend_of(device: int | str) -> str:
    """The backend whose margin applies: ``"cuda"`` for a GPU index, else ``"cpu"``/``"disk"``."""
    return "cuda" if isinstance(device, int) else str(device)


def safety_margin_bytes(device: int | str, memory_bytes: int) -> int:
    """Bytes kept out of ``device``'s budget (``SAFETY_MARGINS``; 0 for unknown backends)."""
    margin = SAFETY_MARGINS.get(backend_of(device))
    return margin.nbytes(memory_bytes) if margin is not None else 0


def gpu_memory_held(index: int) -> tuple[int, int]:
    """``(total_bytes, held_bytes)`` of CUDA device ``index``: held by the driver and every
    process, this one included (its CUDA context is created by the query).

    NVML's ``used`` (``pynvml``, the ``gpu`` extra) is taken when it says more than
    ``mem_get_info``: it also counts memory the driver reserves for itself on recent drivers.
    """
    free_bytes, total_bytes = torch.cuda.mem_get_info(index)
    held = int(total_bytes) - int(free_bytes)
    nvml_used = _nvml_used_bytes(index)
    return int(total_bytes), max(held, nvml_used or 0)


def _nvml_used_bytes(index: int) -> int | None:
    """NVML's used bytes for CUDA device ``index`` (matched by UUID), or ``None`` without NVML."""
    try:
        import pynvml  # noqa: PLC0415 (optional: the ``gpu`` extra)
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            uuid = f"GPU-{torch.cuda.get_device_properties(index).uuid}"
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        finally:
            pynvml.nvmlShutdown()
    except (pynvml.NVMLError, AttributeError, RuntimeError) as exc:
        logger.info("NVML gave no memory figure for cuda:%d: %s", index, exc)
        return None


@dataclass(frozen=True)
class LinkBandwidth:
    """Measured host RAM -> GPU copy bandwidth, decimal GB/s.

    Attributes:
        pinned_gbps: from page-locked memory (what a copy stream with prefetch gets).
        pageable_gbps: from ordinary memory (the driver stages it through a pinned buffer).
        nbytes: bytes per timed copy.
        measured_at: UNIX time of the measurement.
    """

    pinned_gbps: float
    pageable_gbps: float
    nbytes: int
    measured_at: float


def measure_host_to_device(index: int, nbytes: int = 256 * MIB, repeats: int = 3) -> LinkBandwidth:
    """Time ``nbytes`` copies from pinned and from pageable RAM to CUDA device ``index``;
    the best of ``repeats`` each, after one warm-up copy, timed with CUDA events.

    Raises:
        RuntimeError: from CUDA (no such device, out of memory).
    """
    device = torch.device("cuda", index)
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def best_gbps(source: torch.Tensor, target: torch.Tensor) -> float:
        with torch.cuda.device(device):
            target.copy_(source)  # warm-up: page-in, driver staging buffers
            torch.cuda.synchronize(device)
            seconds = []
            for _ in range(repeats):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                target.copy_(source, non_blocking=True)
                end.record()
                end.synchronize()
                seconds.append(start.elapsed_time(end) / 1e3)
        return nbytes / min(seconds) / 1e9

    try:
        pinned_gbps = best_gbps(pinned, target)
        return LinkBandwidth(pinned_gbps, best_gbps(pageable, target), nbytes, time.time())
    finally:
        del target, pinned, pageable
        torch.cuda.empty_cache()  # give the 256 MiB back before anything is planned


def link_cache_path() -> Path:
    """The bandwidth cache: ``<workbench cache dir>/link-bandwidth.json``."""
    return workbench_cache_dir() / "link-bandwidth.json"


def device_cache_key(index: int) -> str:
    """What a measurement is cached under: the GPU's name and UUID (stable across reboots and
    ``CUDA_VISIBLE_DEVICES`` renumbering)."""
    props = torch.cuda.get_device_properties(index)
    return f"{props.name} {getattr(props, 'uuid', index)}"


def cached_link_bandwidth(
    key: str,
    measure: Callable[[], LinkBandwidth],
    cache_path: Path | None = None,
) -> LinkBandwidth:
    """The cached measurement for ``key``, else ``measure()``'s, written to the cache.

    A cache file that is malformed is replaced (with a warning in the log), never fatal.

    Args:
        key: the device (``device_cache_key(index)``).
        measure: takes the measurement (``lambda: measure_host_to_device(index)``).
        cache_path: default ``link_cache_path()``.
    """
    path = cache_path or link_cache_path()
    entries = read_measurement_cache(path, "devices")
    cached = entries.get(key)
    if isinstance(cached, dict):
        try:
            return LinkBandwidth(**cached)
        except TypeError:
            logger.warning("link bandwidth cache %s: bad entry for %s; measuring again", path, key)
    link = measure()
    entries[key] = asdict(link)
    write_measurement_cache(path, "devices", entries)
    return link


def measured_link_bandwidth(gpu_count: int) -> LinkBandwidth | None:
    """The slowest GPU's host-to-device bandwidth (a profile has one link figure), measured
    once per device and cached; ``None`` (typical values, with a warning in the log) when a
    copy fails, e.g. a GPU too full for the 256 MiB test buffer."""
    try:
        links = [
            cached_link_bandwidth(device_cache_key(i), lambda i=i: measure_host_to_device(i))
            for i in range(gpu_count)
        ]
    except (RuntimeError, OSError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        logger.warning("host-to-device bandwidth not measured, typical values used: %s", exc)
        return None
    return min(links, key=lambda link: link.pinned_gbps)


@dataclass(frozen=True)
class CpuKernelProbe:
    """One-token decode matmuls timed on this CPU (``measure_cpu_kernels``).

    Attributes:
        bf16_gbps: the bf16 kernel's effective weight-read bandwidth, decimal GB/s.
        efficiency: ``{precision kind: fraction of bf16_gbps its kernel reaches}`` on stored
            bytes (``kernel_costs`` module docs); kinds that cannot run here are left out.
        seconds: ``{precision kind: best seconds per pass}`` over the probe's weights.
        threads: torch intra-op threads during the measurement.
        nbytes: bf16 bytes of the probe's weights.
        measured_at: UNIX time of the measurement (or of a later one that did not replace it).
        others_busy: the share of the machine other processes took while it timed
            (``machine_load``; ``None``: not known).
    """

    bf16_gbps: float
    efficiency: dict[str, float]
    seconds: dict[str, float]
    threads: int
    nbytes: int
    measured_at: float
    others_busy: float | None = None


PROBE_PRECISIONS: Final = {
    "int8": "int8",
    "int4": "int4-g128",
    "fp8": "fp8",
    "nf4": "nf4",
    "fp4": "fp4",
}
"""The precision each kind is probed at, quantized as the loader does
(``quantization.backends.quantize_weight``)."""


def measure_cpu_kernels(
    out_features: int = 2048,
    in_features: int = 2048,
    weights: int = 4,
    repeats: int = 7,
    kinds: tuple[str, ...] = tuple(PROBE_PRECISIONS),
) -> CpuKernelProbe:
    """Time a ``(1, in_features)`` bf16 activation through ``weights`` Linear weights per
    format: bf16 and each of ``kinds`` quantized as the loader does (torchao int8 / int4-g128 /
    fp8, bitsandbytes nf4 / fp4; a kind whose library is missing is left out). Each timed
    matmul follows a 64 MiB cache flush (its weight comes from memory, as in decode), rounds go
    round-robin over the formats (background load hits all alike), and a format's time is the
    sum over its weights of each one's best of ``repeats``. About 10-30 s on two cores with every kind,
    torchao's import included.

    Raises:
        RuntimeError: from torch or the quantization libraries (out of memory).
    """
    from torch.nn.functional import linear  # noqa: PLC0415

    from workbench.big_modeling.errors import BadInputError  # noqa: PLC0415
    from workbench.big_modeling.quantization.backends import quantize_weight  # noqa: PLC0415 (torchao)
    from workbench.big_modeling.quantization.packed import stored_nbytes  # noqa: PLC0415

    generator = torch.Generator().manual_seed(0)
    dense = [
        (torch.randn(out_features, in_features, generator=generator) * 0.02).to(torch.bfloat16)
        for _ in range(weights)
    ]
    formats: dict[str, list[torch.Tensor]] = {"plain": dense}
    for kind in kinds:
        try:
            formats[kind] = [quantize_weight(weight, PROBE_PRECISIONS[kind]) for weight in dense]
        except BadInputError as exc:  # bitsandbytes (the dev extra) missing
            logger.info("CPU kernel probe: %s not measured: %s", kind, exc)
    stored = {kind: sum(stored_nbytes(w) for w in tensors) for kind, tensors in formats.items()}
    activation = torch.randn(1, in_features, generator=generator).to(torch.bfloat16)
    flush = torch.empty(64 * MIB, dtype=torch.uint8)
    fastest = {kind: [float("inf")] * len(tensors) for kind, tensors in formats.items()}
    with torch.inference_mode():
        for tensors in formats.values():  # warm-up: first-call kernel setup, per weight
            for weight in tensors:
                linear(activation, weight)
        with OtherLoad() as load:
            for round_index in range(repeats):
                for kind, tensors in formats.items():
                    for index, weight in enumerate(tensors):
                        flush.fill_(round_index)  # the weight comes from memory, as in decode
                        start = time.perf_counter()
                        linear(activation, weight)
                        seconds = time.perf_counter() - start
                        fastest[kind][index] = min(fastest[kind][index], seconds)
    best = {kind: sum(times) for kind, times in fastest.items()}
    plain_rate = stored["plain"] / best["plain"]
    return CpuKernelProbe(
        bf16_gbps=plain_rate / 1e9,
        efficiency={kind: (stored[kind] / best[kind]) / plain_rate for kind in formats},
        seconds=best,
        threads=torch.get_num_threads(),
        nbytes=stored["plain"],
        measured_at=time.time(),
        others_busy=load.share,
    )


def measure_cpu_kernels_apart() -> CpuKernelProbe:
    """``measure_cpu_kernels`` in a fresh process (``probe_process``) at this process's thread
    count: the GUI's threads would hold the GIL between the timed calls, and the probe's
    weights and 64 MiB flush buffer (about 0.2 GiB with every kind) would stay in the caller's
    heap after it.

    Raises:
        RuntimeError: the probe process failed.
    """
    return measure_apart("workbench.models.device_probe", CpuKernelProbe, "the CPU kernel probe")


def cpu_kernel_cache_path() -> Path:
    """The CPU kernel cache: ``<workbench cache dir>/cpu-kernels.json``."""
    return workbench_cache_dir() / "cpu-kernels.json"


def cpu_kernel_cache_key() -> str:
    """What a CPU measurement is cached under: the CPU model, the thread count and the torch,
    torchao and bitsandbytes versions (a new kernel library is measured again)."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    versions = [f"torch {torch.__version__}"]
    for package in ("torchao", "bitsandbytes"):
        try:
            versions.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            versions.append(f"{package} none")
    return f"{_cpu_model()}, {torch.get_num_threads()} threads, {', '.join(versions)}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    import platform  # noqa: PLC0415

    return platform.processor() or platform.machine()


def cpu_kernels_entry_key() -> str:
    """``cpu_kernel_cache_key`` and the revision of this project's own CPU matmul paths, which
    the kernel probe times (``bnb4_cpu``, ``int8_cpu``): what the kernel probe is cached under."""
    from workbench.big_modeling.quantization import CPU_KERNELS_REVISION  # noqa: PLC0415

    return f"{cpu_kernel_cache_key()}, workbench kernels r{CPU_KERNELS_REVISION}"


def cached_cpu_kernels(
    measure: Callable[[], CpuKernelProbe] | None = None,
    cache_path: Path | None = None,
    *,
    measure_if_missing: bool = True,
    again: bool = False,
) -> CpuKernelProbe | None:
    """This CPU's cached kernel probe, else ``measure()``'s (default
    ``measure_cpu_kernels_apart``: in a fresh process), written to the cache; ``None`` when
    nothing is cached and ``measure_if_missing`` is false or the measurement fails (typical
    values are used, with a note in the log).

    A malformed cache file or entry is measured again, never fatal; ``again``: measured now,
    in place of the cached entry. The entry's key adds the revision of this project's own CPU
    matmul paths to ``cpu_kernel_cache_key`` (``quantization.CPU_KERNELS_REVISION``): a change
    to them is measured again, as a new library version is.
    """
    return cached_probe(
        cache_path or cpu_kernel_cache_path(),
        "devices",
        cpu_kernels_entry_key(),
        CpuKernelProbe,
        measure or measure_cpu_kernels_apart,
        measure_if_missing=measure_if_missing,
        again=again,
        what="CPU kernels",
    )


if __name__ == "__main__":
    sys.exit(probe_main(lambda spec: asdict(measure_cpu_kernels())))
