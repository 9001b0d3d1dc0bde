"""Carry out a ``LoadPlan``: read each tensor once, straight into its destination.

- CPU, dtype kept: with ``mmap`` (default) the tensor is a copy-on-write memory map of the
  safetensors file (zero copy, pages read on first use); otherwise the bytes are read into the
  new tensor's own buffer (no extra copy).
- CPU, dtype cast: read and cast chunk by chunk through one reused staging buffer (extra = one
  work chunk, ``WORK_CHUNK_NBYTES``).
- CUDA: read in 16 MiB chunks into two alternating pinned buffers, each copied to the GPU on a
  side stream while the next chunk is read (disk reads overlap the host-to-device DMA); casts
  run on the GPU.
- disk: a zero-copy pointer into the safetensors file when the dtype is kept; otherwise the
  cast bytes are staged in the offload folder chunk by chunk (read, cast, write). The model
  tensor becomes ``meta`` (right dtype).

Progress is reported after every tensor and every chunk of a large one (reads: 16 MiB; read +
cast + write: ``WORK_CHUNK_NBYTES``), so reports come well within 100 ms of work; the cancel token
is checked before each tensor and after every chunk. Tensors loaded before a cancel or an error stay
loaded; the rest stay as they were (``meta`` for an empty model); offload files are removed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from workbench.big_modeling.devices import to_torch_device
from workbench.big_modeling.loading import reader
from workbench.big_modeling.loading.distributed import distribute_like, is_dtensor
from workbench.big_modeling.loading.index import TensorInfo
from workbench.big_modeling.loading.offload_staging import OffloadStager
from workbench.big_modeling.loading.plan import LoadPlan, LoadStep, ModelSlot
from workbench.big_modeling.loading.reader import empty_bytes, view_as
from workbench.big_modeling.progress import CancelToken, LoadProgress, ProgressCallback

logger = logging.getLogger(__name__)

# Work unit for casts and offload writes: a 16 MiB read + cast + write takes ~10-40 ms.
WORK_CHUNK_NBYTES = 16 * 1024 * 1024


class ByteSource(Protocol):
    """Where tensor bytes come from: files (``TensorReader``) or a broadcast from rank 0."""

    local_files: bool  # the checkpoint files are readable here (zero-copy pointers allowed)

    def read_into(self, info: TensorInfo, out: torch.Tensor, on_bytes: Any = None) -> None: ...

    def read_range(self, info: TensorInfo, start: int, out: torch.Tensor) -> None: ...


@dataclass
class LoadResult:
    """What a load did. ``offload_index`` holds the entries added to the offload folder."""

    missing_keys: list[str]
    unexpected_keys: list[str]
    nbytes_read: int = 0
    offload_nbytes_written: int = 0
    offload_index: dict[str, dict[str, Any]] = field(default_factory=dict)
    load_s: float = 0.0


class _Progress:
    def __init__(
        self, callback: ProgressCallback | None, cancel: CancelToken | None, total: int
    ) -> None:
        self.callback, self.cancel, self.total = callback, cancel, total
        self.done = 0
        self.name = ""

    def start(self) -> None:
        if self.callback is not None:
            self.callback(LoadProgress(0, self.total, "", "loading"))

    def on_bytes(self, nbytes: int) -> None:
        self.done += nbytes
        if self.callback is not None:
            self.callback(LoadProgress(self.done, self.total, self.name, "loading"))
        if self.cancel is not None:
            self.cancel.raise_if_cancelled()

    def begin(self, name: str) -> None:
        if self.cancel is not None:
            self.cancel.raise_if_cancelled()
        self.name = name

    def end(self, nbytes_unreported: int) -> None:
        self.done += nbytes_unreported
        if self.callback is not None:
            self.callback(LoadProgress(self.done, self.total, self.name, "loading"))


class _PinnedUploader:
    """Two pinned chunk buffers feeding a CUDA side stream (double buffering)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.chunk_nbytes = reader.READ_CHUNK_NBYTES
        self.buffers = [empty_bytes(self.chunk_nbytes, pin_memory=True) for _ in range(2)]
        self.events = [torch.cuda.Event() for _ in range(2)]
        self.turn = 0
        self.stream.wait_stream(torch.cuda.current_stream(device))

    def upload(
        self, source: ByteSource, info: TensorInfo, dest: torch.Tensor, progress: _Progress
    ) -> None:
        # dest was allocated on the current stream; its block may still be in use there
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        dest.record_stream(self.stream)
        for start in range(0, info.nbytes, self.chunk_nbytes):
            nbytes = min(self.chunk_nbytes, info.nbytes - start)
            k, self.turn = self.turn, 1 - self.turn
            self.events[k].synchronize()  # the DMA out of this buffer has finished
            chunk = self.buffers[k][:nbytes]
            source.read_range(info, start, chunk)
            with torch.cuda.stream(self.stream):
                dest[start : start + nbytes].copy_(chunk, non_blocking=True)
                self.events[k].record(self.stream)
            progress.on_bytes(nbytes)

    def finish(self) -> None:
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        self.stream.synchronize()


def _assign(slot: ModelSlot, value: torch.Tensor) -> None:
    """Put ``value`` under every name of ``slot`` (tied names share one Parameter)."""
    stored: torch.Tensor
    if slot.is_buffer:
        stored = value
    else:
        stored = nn.Parameter(value, requires_grad=slot.requires_grad and value.is_floating_point())
    for module, attr in slot.locations:
        if slot.is_buffer:
            module._buffers[attr] = stored
        else:
            module._parameters[attr] = stored


def _current(slot: ModelSlot) -> torch.Tensor:
    module, attr = slot.locations[0]
    return module._buffers[attr] if slot.is_buffer else module._parameters[attr]


class LoadExecutor:
    """Runs the steps of one plan against one byte source."""

    def __init__(
        self,
        source: ByteSource,
        *,
        stager: OffloadStager | None,
        progress: ProgressCallback | None,
        cancel: CancelToken | None,
        mmap: bool = True,
    ) -> None:
        self.source = source
        self.mmap = mmap and hasattr(source, "map")
        self.stager = stager
        self.progress_callback = progress
        self.cancel = cancel
        self._staging = torch.empty(0, dtype=torch.uint8)
        self._uploaders: dict[torch.device, _PinnedUploader] = {}
        self.full_state_dict = True

    def run(self, plan: LoadPlan) -> LoadResult:
        """Load every step; on any exception undo the offload folder and re-raise."""
        start_s = time.perf_counter()
        own_cancel = None if getattr(self.source, "handles_cancel", False) else self.cancel
        progress = _Progress(self.progress_callback, own_cancel, plan.nbytes)
        progress.start()
        try:
            for step in plan.steps:
                progress.begin(step.info.name)
                before = progress.done
                self._load(step, progress)
                progress.end(step.info.nbytes - (progress.done - before))
            for uploader in self._uploaders.values():
                uploader.finish()
            if own_cancel is not None:
                own_cancel.raise_if_cancelled()
            if self.stager is not None:
                self.stager.commit()
        except BaseException:
            for uploader in self._uploaders.values():
                uploader.stream.synchronize()
            if self.stager is not None:
                self.stager.abort()
            raise
        finally:
            self._staging = torch.empty(0, dtype=torch.uint8)
            self._uploaders.clear()
        return LoadResult(
            plan.missing_keys,
            plan.unexpected_keys,
            nbytes_read=progress.done,
            offload_nbytes_written=self.stager.nbytes_written if self.stager else 0,
            offload_index=dict(self.stager.entries) if self.stager else {},
            load_s=time.perf_counter() - start_s,
        )

    def _stage(self, info: TensorInfo, progress: _Progress) -> torch.Tensor:
        """Read ``info`` into the reused staging buffer; return a view of it (valid until next)."""
        if self._staging.numel() < info.nbytes:
            self._staging = empty_bytes(info.nbytes)
        self.source.read_into(info, self._staging, progress.on_bytes)
        return view_as(self._staging, info.dtype, info.shape)

    def _load(self, step: LoadStep, progress: _Progress) -> None:
        info, slot = step.info, step.slot
        device = step.device
        current = _current(slot)
        if is_dtensor(current):
            full = self._stage(info, progress).to(step.dtype, copy=True)
            _assign(slot, distribute_like(current, full, full_state_dict=self.full_state_dict))
            return
        if device == "keep":
            if current.device.type != "meta":
                self._load_in_place(step, current, progress)
                return
            device = "cpu"
        if device == "meta":
            _assign(slot, torch.empty(info.shape, dtype=step.dtype, device="meta"))
            return
        if device == "disk":
            self._offload(step, progress)
            return
        target = to_torch_device(device)
        if target.type == "cpu":
            _assign(slot, self._read_cpu(info, step.dtype, progress))
        elif (
            target.type == "cuda"
            and self.source.local_files
            and info.is_safetensors
            and info.nbytes
        ):
            dest = torch.empty(info.nbytes, dtype=torch.uint8, device=target)
            self._uploader(target).upload(self.source, info, dest, progress)
            value = view_as(dest, info.dtype, info.shape)
            if step.dtype != info.dtype:
                torch.cuda.current_stream(target).wait_stream(self._uploader(target).stream)
                value = value.to(step.dtype)
            _assign(slot, value)
        else:
            staged = self._stage(info, progress)
            _assign(slot, staged.to(target, dtype=step.dtype))

    def _uploader(self, device: torch.device) -> _PinnedUploader:
        if device not in self._uploaders:
            self._uploaders[device] = _PinnedUploader(device)
        return self._uploaders[device]

    def _read_cpu(self, info: TensorInfo, dtype: torch.dtype, progress: _Progress) -> torch.Tensor:
        if dtype == info.dtype and self.mmap:
            mapped = self.source.map(info)  # type: ignore[attr-defined]
            if mapped is not None:
                return mapped
        if dtype == info.dtype:
            buffer = empty_bytes(info.nbytes)
            self.source.read_into(info, buffer, progress.on_bytes)
            return view_as(buffer, info.dtype, info.shape)
        return self._cast_cpu(info, dtype, progress)

    def _chunks(self, info: TensorInfo) -> Iterator[torch.Tensor]:
        """Yield ``info``'s values as flat ``info.dtype`` chunks of ``WORK_CHUNK_NBYTES`` at most.

        Each chunk is a view of the reused staging buffer, valid until the next one. Local
        safetensors data is read chunk by chunk; other sources are read whole, then sliced.
        """
        itemsize = info.dtype.itemsize
        step = max(1, WORK_CHUNK_NBYTES // itemsize) * itemsize
        if info.is_safetensors and self.source.local_files:
            if self._staging.numel() < min(step, info.nbytes):
                self._staging = empty_bytes(min(step, info.nbytes))
            for start in range(0, info.nbytes, step):
                chunk = self._staging[: min(step, info.nbytes - start)]
                self.source.read_range(info, start, chunk)
                yield chunk.view(info.dtype)
            return
        if self._staging.numel() < info.nbytes:
            self._staging = empty_bytes(info.nbytes)
        self.source.read_into(info, self._staging)
        for start in range(0, info.nbytes, step):
            yield self._staging[start : min(start + step, info.nbytes)].view(info.dtype)

    def _cast_cpu(self, info: TensorInfo, dtype: torch.dtype, progress: _Progress) -> torch.Tensor:
        """A new CPU tensor of ``dtype`` holding ``info``'s values, cast chunk by chunk."""
        out = torch.empty(info.nbytes // info.dtype.itemsize, dtype=dtype)
        done = 0
        for chunk in self._chunks(info):
            out[done : done + chunk.numel()].copy_(chunk)
            done += chunk.numel()
            progress.on_bytes(chunk.numel() * info.dtype.itemsize)
        return out.reshape(info.shape)

    def _load_in_place(self, step: LoadStep, current: torch.Tensor, progress: _Progress) -> None:
        """``device_map=None`` on a materialised model: fill the existing tensor, keep identity."""
        info = step.info
        if current.dtype != step.dtype:
            if current.device.type == "cpu":
                _assign(step.slot, self._cast_cpu(info, step.dtype, progress))
            else:
                _assign(step.slot, self._stage(info, progress).to(current.device, dtype=step.dtype))
            return
        if (
            current.device.type == "cpu"
            and current.is_contiguous()
            and info.dtype == current.dtype
            and info.nbytes
        ):
            raw = current.detach().reshape(-1).view(torch.uint8)
            self.source.read_into(info, raw, progress.on_bytes)
            return
        with torch.no_grad():
            current.copy_(self._stage(info, progress))

    def _offload(self, step: LoadStep, progress: _Progress) -> None:
        info, slot = step.info, step.slot
        assert self.stager is not None, "plan_load guarantees an offload folder for disk steps"
        if info.is_safetensors and step.dtype == info.dtype and self.source.local_files:
            for name in slot.names:
                self.stager.point_into(name, info)
        else:
            with self.stager.stage(slot.names, step.dtype, info.shape) as out:
                for chunk in self._chunks(info):
                    out.write(chunk if step.dtype == info.dtype else chunk.to(step.dtype))
                    progress.on_bytes(chunk.numel() * info.dtype.itemsize)
        _assign(slot, torch.empty(info.shape, dtype=step.dtype, device="meta"))
