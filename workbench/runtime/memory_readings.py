"""Reading memory figures in the worker: anonymous RSS and its peak, the bytes the model's
weights occupy per device (and how many are mapped from files), the offloaded weights' files,
the CUDA devices in use. ``memory_reconcile`` turns them into a predicted-vs-measured record.

Example:
    >>> import torch.nn as nn
    >>> resident_weight_bytes(nn.Linear(4, 2))  # 2*4 + 2 floats of 4 B
    {'cpu': 40}
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from workbench.big_modeling.devices import device_label
from workbench.big_modeling.offload.folder import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    raw_weight_path,
)

__all__ = [
    "AnonPeakSampler",
    "cuda_devices_in_use",
    "file_mapped_bytes",
    "offloaded_file_bytes",
    "read_anonymous_bytes",
    "read_mapped_bytes",
    "resident_weight_bytes",
    "weight_ranges",
]

logger = logging.getLogger(__name__)

_SMAPS_ROLLUP = "/proc/self/smaps_rollup"
_STATUS = "/proc/self/status"
_STATM = "/proc/self/statm"
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_SMAPS = "/proc/self/smaps"
_MAPS = "/proc/self/maps"
PEAK_SAMPLE_S = 0.002  # a run's CPU peak: RssAnon every 2 ms (one small /proc read each)


def _kib_field(path: str, key: bytes) -> int | None:
    """``<key>  1234 kB`` of a ``/proc`` file in bytes; ``None`` when absent or unreadable."""
    try:
        with open(path, "rb") as handle:
            text = handle.read()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key):
            fields = line[len(key) :].split()
            try:
                return int(fields[0]) * 1024  # the kernel writes kB meaning KiB
            except (IndexError, ValueError):
                return None
    return None


def read_mapped_bytes(
    folders: Iterable[str | os.PathLike[str]], smaps_path: str = _SMAPS
) -> int | None:
    """Resident bytes of this process's mappings of files under ``folders`` (``Rss`` of each
    such mapping in ``/proc/self/smaps``): a zero-copy load's checkpoint, an offload folder's
    files; ``None`` where the system does not say.

    Example:
        >>> nbytes = read_mapped_bytes(["/nonexistent"])
        >>> nbytes is None or nbytes == 0
        True
    """
    roots = tuple(os.fsencode(os.path.realpath(folder)) + os.sep.encode() for folder in folders)
    total, counting = 0, False
    try:  # line by line: the whole file (megabytes) would stay in the heap the run measures
        with open(smaps_path, "rb") as handle:
            for line in handle:
                if line.startswith(b"Rss:"):
                    if counting:
                        total += int(line.split()[1]) * 1024
                elif not line[:1].isupper():  # a mapping's header: "start-end perms ..."
                    fields = line.rstrip(b"\n").split(maxsplit=5)
                    counting = len(fields) == 6 and fields[5].startswith(roots)
    except OSError:
        return None
    return total


def read_anonymous_bytes(rollup_path: str = _SMAPS_ROLLUP) -> int | None:
    """This process's anonymous resident bytes (heap, torch's CPU tensors), exact.

    ``Anonymous`` of ``/proc/self/smaps_rollup`` (Linux 4.14+), else ``RssAnon`` of
    ``/proc/self/status``; ``None`` on systems without either. File-backed pages (memory-mapped
    checkpoints and offload files) are not in it.

    Example:
        >>> nbytes = read_anonymous_bytes()
        >>> nbytes is None or nbytes > 0
        True
    """
    exact = _kib_field(rollup_path, b"Anonymous:")
    return exact if exact is not None else _kib_field(_STATUS, b"RssAnon:")


class AnonPeakSampler:
    """A thread keeping the highest ``RssAnon`` seen until ``stop()`` (a run's CPU peak).

    ``start_bytes`` is its first reading, taken by the thread once it runs, so the sampler's own
    stack and malloc arena (240 KiB the first time, a tenth of a small model's run) are in it,
    not in the peak above it; ``start()`` returns after that reading.

    Each reading is ``/proc/self/statm``'s resident minus shared pages (the kernel's anonymous
    page counter, the one ``RssAnon`` prints), read from a descriptor opened once: 1 us where
    parsing ``/proc/self/status`` took 20. On a 2-core CPU, sampling with ``status`` every 2 ms
    slowed SmolLM2-135M's decode steps by 3.0 ms (40.1 ms against 37.1 without a sampler),
    ``statm`` by 1.7 ms (38.8)."""

    def __init__(self, period_s: float = PEAK_SAMPLE_S) -> None:
        self.period_s = period_s
        self.start_bytes = self.peak_bytes = 0
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-peak", daemon=True)
        self._statm: int | None = None

    def start(self) -> None:
        try:
            self._statm = os.open(_STATM, os.O_RDONLY)
        except (OSError, AttributeError):  # no /proc: the status file, or nothing
            self._statm = None
        self._thread.start()
        self._started.wait()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self._sample()
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None
        return self.peak_bytes

    def _read(self) -> int:
        if self._statm is not None:
            try:
                fields = os.pread(self._statm, 128, 0).split()
                return (int(fields[1]) - int(fields[2])) * _PAGE_BYTES
            except (OSError, ValueError, IndexError):
                pass
        return _kib_field(_STATUS, b"RssAnon:") or 0

    def _sample(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self._read())

    def _run(self) -> None:
        try:
            self._sample()
            self.start_bytes = self.peak_bytes
        finally:  # start() waits for this, whatever the reading did
            self._started.set()
        while not self._stop.wait(self.period_s):
            self._sample()


def _byte_span(tensor: torch.Tensor) -> tuple[int, int] | None:
    """The ``[start, end)`` addresses of ``tensor``'s elements (strided views included)."""
    if tensor.device.type == "meta" or tensor.numel() == 0:
        return None
    shape, strides = tensor.shape, tensor.stride()
    extent = 1 + sum((size - 1) * stride for size, stride in zip(shape, strides, strict=True))
    start = tensor.data_ptr()
    return start, start + extent * tensor.element_size()


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _hook_weight_maps(model: nn.Module) -> list[Mapping[str, Any]]:
    """The in-memory tensors behind the offload hooks (each state dict once)."""
    found: dict[int, Mapping[str, Any]] = {}
    for module in model.modules():
        hook = getattr(module, "_hf_hook", None)
        hooks = getattr(hook, "hooks", (hook,)) if hook is not None else ()
        for one in hooks:
            weights = getattr(one, "weights_map", None)
            while isinstance(weights, PrefixedDataset):
                weights = weights.dataset
            if isinstance(weights, OffloadedWeightsLoader):
                weights = weights.state_dict  # the index part lives on disk: not resident
            if isinstance(weights, Mapping):
                found.setdefault(id(weights), weights)
    return list(found.values())


def _plain_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """A quantized (torchao) weight is a wrapper whose data pointer is 0: its inner tensors."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is None:
        return [tensor]
    names, _attributes = flatten()
    return [inner for name in names for inner in _plain_tensors(getattr(tensor, name))]


def _weight_tensors(model: nn.Module) -> list[torch.Tensor]:
    tensors: list[torch.Tensor] = []
    for module in model.modules():
        tensors.extend(p for p in module._parameters.values() if p is not None)
        tensors.extend(
            b
            for name, b in module._buffers.items()
            if b is not None and name not in module._non_persistent_buffers_set
        )
    for weights in _hook_weight_maps(model):
        tensors.extend(v for v in weights.values() if isinstance(v, torch.Tensor))
    return [plain for tensor in tensors for plain in _plain_tensors(tensor)]


def weight_ranges(model: nn.Module) -> dict[str, list[tuple[int, int]]]:
    """The address ranges the model's weights occupy per device, merged (sorted, disjoint).

    Weights: parameters, persistent buffers and the offload hooks' in-memory state dicts.
    Overlaps are counted once: tied weights, views, and tensors that are slices of one
    memory-mapped checkpoint shard (a zero-copy load), whose storage is the whole file.
    Non-persistent buffers (rotary ``inv_freq``) are not weights (no checkpoint holds them);
    ``meta`` placeholders and disk-offloaded weights hold no memory.
    """
    spans: dict[str, list[tuple[int, int]]] = {}
    for tensor in _weight_tensors(model):
        span = _byte_span(tensor)
        if span is not None:
            spans.setdefault(device_label(tensor.device), []).append(span)
    return {device: _merged(found) for device, found in spans.items()}


def resident_weight_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of weights resident per device, each byte once (see ``weight_ranges``).

    Example:
        >>> resident_weight_bytes(nn.Linear(4, 2))  # 2*4 + 2 floats of 4 B
        {'cpu': 40}
    """
    return {
        device: sum(end - start for start, end in ranges)
        for device, ranges in weight_ranges(model).items()
    }


def file_mapped_bytes(ranges: list[tuple[int, int]], maps_path: str = _MAPS) -> int:
    """Bytes of ``ranges`` (merged CPU addresses) that lie in file mappings of this process
    (``/proc/self/maps`` lines with an inode): weights memory-mapped from a checkpoint or an
    offload file, which count as file pages, not as anonymous memory. 0 where unreadable."""
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return 0
    mapped: list[tuple[int, int]] = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[4] != "0" and not fields[5].startswith("["):
            low, _, high = fields[0].partition("-")
            mapped.append((int(low, 16), int(high, 16)))
    mapped = _merged(mapped)
    total, index = 0, 0
    for start, end in ranges:
        while index < len(mapped) and mapped[index][1] <= start:
            index += 1
        probe = index
        while probe < len(mapped) and mapped[probe][0] < end:
            total += min(end, mapped[probe][1]) - max(start, mapped[probe][0])
            probe += 1
    return total


def offloaded_file_bytes(model: nn.Module) -> int:
    """Bytes of the disk-offloaded weights: their ``.dat`` files in the offload folder (an
    entry pointing into a safetensors checkpoint counts its tensor's bytes there), each once:
    a tied weight's names point at the same checkpoint tensor, or at hard links of one file
    (SmolLM2-135M all on disk measured 311 MiB, its 54 MiB tied embedding twice, against the
    257 MiB the disk holds)."""
    loaders: dict[int, OffloadedWeightsLoader] = {}
    for module in model.modules():
        hook = getattr(module, "_hf_hook", None)
        for one in getattr(hook, "hooks", (hook,)) if hook is not None else ():
            weights = getattr(one, "weights_map", None)
            while isinstance(weights, PrefixedDataset):
                weights = weights.dataset
            if isinstance(weights, OffloadedWeightsLoader):
                loaders.setdefault(id(weights), weights)
    counted: dict[tuple[object, ...], int] = {}
    for loader in loaders.values():
        for key, info in loader.index.items():
            if key in loader.state_dict or "torchao" in info:  # a packed weight's bytes are
                continue  # its inner entries (pointers into the packed safetensors file)
            if "safetensors_file" in info or loader.save_folder is None:
                itemsize = torch.empty((), dtype=_dtype_of(info["dtype"])).element_size()
                where = (info.get("safetensors_file"), info.get("weight_name", key))
                counted[where] = itemsize * _numel(info["shape"])
            else:
                found = raw_weight_path(loader.save_folder, key).stat()
                counted[found.st_dev, found.st_ino] = found.st_size
    return sum(counted.values())


def _dtype_of(name: str) -> torch.dtype:
    return getattr(torch, str(name).replace("torch.", ""))


def _numel(shape: Iterable[int]) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count


def cuda_devices_in_use() -> list[int]:
    """CUDA devices a job may have used: none unless CUDA is initialised in this process."""
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return list(range(torch.cuda.device_count()))
    except Exception:  # a broken driver: no CUDA figures, never a failed job
        logger.debug("CUDA not readable", exc_info=True)
    return []
