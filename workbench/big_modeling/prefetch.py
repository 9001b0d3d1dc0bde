"""Prefetch: bring the next offloaded module's weights in while the current one computes.

Opt-in with ``dispatch_model(..., prefetch=True)`` or ``enable_prefetch(model)``. The order of
modules is learned as they run (each module's successor is the module that ran after it last
time), so the first forward teaches the order and a changed order is picked up on the next
pass. A prefetch is only ever used by the module it was made for: a wrong guess costs a wasted
read, never a wrong weight.

- CUDA execution device: weights are copied on a side stream from pinned host memory (pinned
  copies of in-memory weights are made once; disk weights go through the caching pinned
  allocator), and the compute stream waits on an event before the module uses them.
- CPU execution device with weights on disk: a background reader thread asks the kernel to read
  the next modules' files into the page cache (``posix_fadvise(WILLNEED)``) while the current
  module computes, and the module then uses its memory-mapped weights in place (zero copy).
  With ``disk_reads="read"`` the thread instead reads raw offload files whole into buffers
  that the module uses in place.

Example:
    >>> import torch
    >>> from workbench.big_modeling.dispatch import cpu_offload
    >>> model = cpu_offload(torch.nn.Sequential(torch.nn.Linear(2, 2)), "cpu")
    >>> prefetcher = enable_prefetch(model)
    >>> model(torch.ones(1, 2)).shape
    torch.Size([1, 2])
    >>> disable_prefetch(model)
"""

from __future__ import annotations

import json
import logging
import os
import queue
import struct
import threading
import weakref
from typing import Any

import torch
from torch import Tensor, nn

from workbench.big_modeling.align_hook import AlignDevicesHook
from workbench.big_modeling.hooks import iter_hooks

logger = logging.getLogger(__name__)

FileRange = tuple[str, int, int]  # path, offset, nbytes
_DTYPES = {
    str(v).removeprefix("torch."): v for v in vars(torch).values() if isinstance(v, torch.dtype)
}


def _safetensors_offsets(
    path: str, cache: dict[str, dict[str, tuple[int, int]]]
) -> dict[str, tuple[int, int]]:
    """``{tensor name: (absolute offset, nbytes)}`` from a safetensors header (read once)."""
    found = cache.get(path)
    if found is None:
        with open(path, "rb") as handle:
            (header_nbytes,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(header_nbytes))
        base = 8 + header_nbytes
        found = {
            name: (
                base + info["data_offsets"][0],
                info["data_offsets"][1] - info["data_offsets"][0],
            )
            for name, info in header.items()
            if name != "__metadata__"
        }
        cache[path] = found
    return found


def disk_ranges(hook: AlignDevicesHook, cache: dict[str, Any]) -> list[tuple[str, int, int, Any]]:
    """``(path, offset, nbytes, slot)`` of the file ranges holding ``hook``'s disk tensors."""
    ranges = []
    for slot in hook.slots:
        mapping, key = slot.mapping, slot.key
        index = getattr(mapping, "index", None)
        if slot.source != "disk" or index is None or key not in index:
            continue
        info = index[key]
        file = info.get("safetensors_file")
        if file is not None:
            offsets = _safetensors_offsets(file, cache).get(info.get("weight_name", key))
            if offsets is not None:
                ranges.append((file, *offsets, slot))
        elif getattr(mapping, "save_folder", None) is not None:
            from workbench.big_modeling.offload import raw_weight_path

            path = str(raw_weight_path(mapping.save_folder, key))
            ranges.append((path, 0, os.path.getsize(path), slot))
    return ranges


class ReadJob:
    """Whole-file reads of one module's raw offloaded tensors, done by the reader thread."""

    def __init__(self, entries: list[tuple[str, str, int, torch.dtype, tuple[int, ...]]]) -> None:
        self.entries = entries  # (slot name, path, nbytes, dtype, shape)
        self.done = threading.Event()
        self.tensors: dict[str, Tensor] | None = None

    def run(self) -> None:
        tensors = {}
        try:
            for name, path, nbytes, dtype, shape in self.entries:
                raw = torch.empty(nbytes, dtype=torch.uint8)
                view = memoryview(raw.numpy())
                with open(path, "rb", buffering=0) as handle:
                    filled = 0
                    while filled < nbytes:  # one large sequential read per file
                        count = handle.readinto(view[filled:])
                        if not count:
                            raise OSError(f"{path}: ends after {filled} of {nbytes} B")
                        filled += count
                tensors[name] = raw.view(dtype).reshape(shape)
            self.tensors = tensors
        except OSError as exc:  # the forward falls back to the memory-mapped read
            logger.debug("prefetch read failed: %s", exc)
        finally:
            self.done.set()

    def wait(self) -> dict[str, Tensor] | None:
        self.done.wait()
        return self.tensors


def _reader_loop(requests: queue.SimpleQueue) -> None:
    """Background reader: whole-file reads (``ReadJob``) or page-cache advice (ranges)."""
    while True:
        item = requests.get()
        if item is None:
            return
        if isinstance(item, ReadJob):
            item.run()
            continue
        for path, offset, nbytes in item:
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_WILLNEED)
                finally:
                    os.close(fd)
            except OSError as exc:  # a prefetch is a hint: the forward reads the file anyway
                logger.debug("prefetch of %s failed: %s", path, exc)


class Prefetcher:
    """Fetches the successor of each offloaded module while the module computes.

    Args:
        hooks: the offloading hooks of one model (their ``prefetcher`` is set to this).
        depth: how many modules ahead to fetch (CPU/disk reads; CUDA copies fetch one ahead).
        disk_reads: ``"advise"`` (default) asks the kernel to read the files ahead and keeps
            zero-copy memory maps (no copy; measured best on a busy 2-core machine);
            ``"read"`` reads raw offload files whole into fresh buffers on the reader thread
            (one large sequential read, but a copy out of the page cache on another core).
    """

    def __init__(
        self, hooks: list[AlignDevicesHook], *, depth: int = 2, disk_reads: str = "advise"
    ) -> None:
        if disk_reads not in ("read", "advise"):
            raise ValueError(f"disk_reads must be 'read' or 'advise', not {disk_reads!r}")
        self.hooks = hooks
        self.depth = depth
        self.disk_reads = disk_reads
        self.successor: dict[int, AlignDevicesHook] = {}
        self._previous: AlignDevicesHook | None = None
        self._pending: dict[int, tuple[Any, dict[str, Tensor]]] = {}
        self._pinned: dict[int, Tensor] = {}
        self._plans: dict[int, tuple[list, list[FileRange]]] = {}
        self._reads: dict[int, ReadJob] = {}
        self._advised: set[int] = set()
        self._header_cache: dict[str, Any] = {}
        self._stream: Any = None
        self._requests: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None
        self.hits = 0
        self.misses = 0
        for hook in hooks:
            hook.prefetcher = self

    # -- called by AlignDevicesHook._onload ----------------------------------------------------

    def take(self, hook: AlignDevicesHook) -> dict[str, Tensor] | None:
        """Learn the order, return what was prefetched for ``hook``, fetch its successors."""
        previous, self._previous = self._previous, hook
        if previous is not None and previous is not hook:
            self.successor[id(previous)] = hook
        device = hook._device
        if device is not None and device.type == "cuda":
            ready = self._take_cuda(hook)
            following = self.successor.get(id(hook))
            for stale in [key for key in self._pending if key != id(following)]:
                del self._pending[stale]  # the order changed; side-stream frees are ordered
            if following is not None and following is not hook:
                self._fetch_cuda(following)
            return ready
        return self._take_disk(hook)

    # -- CPU execution: page-cache readahead ---------------------------------------------------

    def _take_disk(self, hook: AlignDevicesHook) -> dict[str, Tensor] | None:
        job = self._reads.pop(id(hook), None)
        self._fetch_disk(hook)  # queue the successors first: the reader never idles
        tensors = None if job is None else job.wait()
        advised = id(hook) in self._advised
        self._advised.discard(id(hook))
        if tensors is None and not advised:
            self.misses += 1
        else:
            self.hits += 1
        return tensors

    def _fetch_disk(self, hook: AlignDevicesHook) -> None:
        advice: list[FileRange] = []
        chain: set[int] = set()
        current = hook
        for _ in range(self.depth):
            current = self.successor.get(id(current))
            if current is None or current is hook:
                break
            chain.add(id(current))
            if id(current) in self._reads:
                continue
            raw, other = self._disk_plan(current)
            if raw:
                job = self._reads[id(current)] = ReadJob(raw)
                self._reader().put(job)
            if other:
                advice.extend(other)
                self._advised.add(id(current))
        for stale in [key for key in self._reads if key not in chain]:
            del self._reads[stale]  # the order changed: that read is never used
        if advice:
            self._reader().put(advice)

    def _disk_plan(self, hook: AlignDevicesHook) -> tuple[list, list[FileRange]]:
        """Raw ``.dat`` tensors to read whole, and other file ranges to advise."""
        plan = self._plans.get(id(hook))
        if plan is None:
            raw, other = [], []
            for path, offset, nbytes, slot in disk_ranges(hook, self._header_cache):
                info = slot.mapping.index[slot.key]
                if "safetensors_file" in info or offset or self.disk_reads == "advise":
                    other.append((path, offset, nbytes))
                else:
                    stored_dtype = _DTYPES.get(info["dtype"], slot.dtype)
                    raw.append((slot.name, path, nbytes, stored_dtype, tuple(info["shape"])))
            plan = self._plans[id(hook)] = (raw, other)
        return plan

    def _reader(self) -> queue.SimpleQueue:
        if self._requests is None:
            self._requests = queue.SimpleQueue()
            self._thread = threading.Thread(
                target=_reader_loop, args=(self._requests,), name="workbench-prefetch", daemon=True
            )
            self._thread.start()
            weakref.finalize(self, self._requests.put, None)
        return self._requests

    # -- CUDA execution: side-stream copies from pinned memory ---------------------------------

    def _pinned_source(self, slot: Any) -> Tensor:
        stored = slot.mapping[slot.key]
        if stored.device.type != "cpu":
            return stored
        if slot.stable:  # in-memory weights: pinned once, reused every forward
            pinned = self._pinned.get(id(slot))
            if pinned is None:
                pinned = self._pinned[id(slot)] = stored.pin_memory()
            return pinned
        return stored.pin_memory()  # disk weights: the caching host allocator recycles these

    def _fetch_cuda(self, hook: AlignDevicesHook) -> None:
        if id(hook) in self._pending:
            return
        device = hook._device
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        fetched: dict[str, Tensor] = {}
        with torch.cuda.stream(self._stream):
            for slot in hook.slots:
                if slot.tie is not None:
                    continue  # tied weights come from tied_params_map
                source = self._pinned_source(slot)
                fetched[slot.name] = source.to(device, dtype=slot.dtype, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        self._pending[id(hook)] = (event, fetched)

    def _take_cuda(self, hook: AlignDevicesHook) -> dict[str, Tensor] | None:
        pending = self._pending.pop(id(hook), None)
        if pending is None:
            self.misses += 1
            return None
        self.hits += 1
        event, fetched = pending
        current = torch.cuda.current_stream(hook._device)
        current.wait_event(event)
        for tensor in fetched.values():
            tensor.record_stream(current)  # memory stays reserved until compute is done
        return fetched

    def close(self) -> None:
        """Stop the reader thread and drop pinned copies and pending prefetches."""
        if self._requests is not None:
            self._requests.put(None)
            if self._thread is not None:
                self._thread.join(timeout=10)
            self._requests = self._thread = None
        for job in self._reads.values():
            job.done.wait()
        self._reads.clear()
        self._pending.clear()
        self._pinned.clear()
        for hook in self.hooks:
            if hook.prefetcher is self:
                hook.prefetcher = None

    def __repr__(self) -> str:
        return f"Prefetcher({len(self.hooks)} modules, {len(self.successor)} successors learned)"


def enable_prefetch(model: nn.Module, *, depth: int = 2, disk_reads: str = "advise") -> Prefetcher:
    """Prefetch the offloaded weights of ``model``'s modules (see the module docstring).

    Args:
        model: a model dispatched or offloaded with this package's hooks.
        depth: keyword-only; modules fetched ahead for disk reads.
        disk_reads: keyword-only; ``"advise"`` (default) or ``"read"``, see ``Prefetcher``.

    Returns:
        The ``Prefetcher`` (also stored as ``model._wb_prefetcher``).

    Example:
        >>> import torch
        >>> from workbench.big_modeling.dispatch import cpu_offload
        >>> enable_prefetch(cpu_offload(torch.nn.Linear(2, 2), "cpu"))
        Prefetcher(1 modules, 0 successors learned)
    """
    disable_prefetch(model)
    hooks = [
        hook
        for module in model.modules()
        for hook in iter_hooks(module.__dict__.get("_hf_hook"))
        if isinstance(hook, AlignDevicesHook) and hook.offload
    ]
    prefetcher = Prefetcher(hooks, depth=depth, disk_reads=disk_reads)
    model._wb_prefetcher = prefetcher
    return prefetcher


def disable_prefetch(model: nn.Module) -> None:
    """Stop prefetching for ``model`` (a no-op when it was not enabled)."""
    prefetcher = model.__dict__.pop("_wb_prefetcher", None)
    if prefetcher is not None:
        prefetcher.close()
