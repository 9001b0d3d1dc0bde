"""What a budget must leave out, measured on this machine: memory others hold, a safety
margin per backend, and the host-to-device copy bandwidth (pinned and pageable).

A GPU's budget is ``memory - held - margin``:

- *held*: what the driver and other processes already use (``torch.cuda.mem_get_info``: total
  minus free; NVML's ``used`` where ``pynvml`` is installed, the ``gpu`` extra, when it says more).
- *margin*: what a load needs beyond its tensors (``SAFETY_MARGINS`` documents each backend).

The copy bandwidth comes from a small timed copy (256 MiB, best of 3) to each GPU, cached per
device in ``<cache dir>/link-bandwidth.json`` (written atomically), so it is measured once.
Without a GPU nothing here touches CUDA: ``gpu_memory_held`` and ``cached_link_bandwidth`` are
only called for devices that exist.

Example:
    >>> safety_margin_bytes("cpu", 16 * 2**30)
    0
    >>> round(safety_margin_bytes(0, 24 * 2**30) / 2**30, 2)  # 0.5 GiB + 2 % of 24 GiB
    0.98
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import torch

from workbench.big_modeling.atomic import atomic_write_text
from workbench.big_modeling.json_files import JsonFileError, read_json
from workbench.models.cache_dirs import workbench_cache_dir

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
    entries = _read_cache(path)
    cached = entries.get(key)
    if isinstance(cached, dict):
        try:
            return LinkBandwidth(**cached)
        except TypeError:
            logger.warning("link bandwidth cache %s: bad entry for %s; measuring again", path, key)
    link = measure()
    entries[key] = asdict(link)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"version": 1, "devices": entries}, indent=2) + "\n")
    return link


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = read_json(
            path,
            what="the link bandwidth cache",
            fix="It is measured again and rewritten.",
            max_nbytes=2**20,
        )
    except FileNotFoundError:
        return {}
    except JsonFileError as exc:
        logger.warning("%s", exc)
        return {}
    devices = data.get("devices") if isinstance(data, dict) else None
    return dict(devices) if isinstance(devices, dict) else {}


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
