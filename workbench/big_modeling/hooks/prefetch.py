"""Prefetch: bring the next offloaded module's weights in while the current one computes.

Opt-in with ``dispatch_model(..., prefetch=True)`` or ``enable_prefetch(model)``. The order of
modules is learned as they run (each module's successor is the module that ran after it last
time), so the first forward teaches the order and a changed order is picked up on the next
pass. A prefetch is only ever used by the module it was made for: a wrong guess costs a wasted
read, never a wrong weight.

- CUDA execution device: weights are copied on a side stream from pinned host memory (pinned
  copies of in-memory weights are made once; disk weights go through the caching pinned
  allocator), and the compute stream waits on an event before the module uses them.
- CPU execution device with weights on disk: a background reader thread memory-maps the next
  modules' weights and populates the mappings (``madvise(MADV_POPULATE_READ)``, which reads
  from disk what is not cached and fills the page tables) while the current module computes;
  the module then uses those mappings in place (zero copy, no page faults on the compute
  thread). The reader works one module at a time in execution order, and each forward queues
  its successors before it waits, so with a cold cache the disk is busy from the first module
  to the last. ``disk_reads="advise"`` only asks the kernel to read ahead
  (``posix_fadvise(WILLNEED)``) and leaves the faults to the module; ``disk_reads="read"`` reads
  raw offload files whole into fresh buffers (a copy out of the page cache).

Memory: at most ``depth`` modules are fetched ahead, so prefetching holds at most
``depth x (bytes of the largest offloaded module)`` beyond what the running module uses
(mapped page-cache pages, or buffers with ``"read"``). Prefetches made for the next forward
stay held between forwards until used or until ``Prefetcher.discard()``.

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

import queue
import threading
import time
import weakref
from typing import Any

import torch
from torch import Tensor, nn

from workbench.big_modeling.dtypes import lookup_dtype
from workbench.big_modeling.hooks.align import AlignDevicesHook
from workbench.big_modeling.hooks.base import iter_hooks
from workbench.big_modeling.hooks.prefetch_reader import (
    DiskJob,
    FileRange,
    MapJob,
    ReadJob,
    disk_ranges,
    reader_loop,
)

_DISK_READS = ("populate", "advise", "read")


class Prefetcher:
    """Fetches the successor of each offloaded module while the module computes.

    Args:
        hooks: the offloading hooks of one model (their ``prefetcher`` is set to this).
        depth: how many modules ahead to fetch (CPU/disk reads; CUDA copies fetch one ahead).
            Bounds the memory held ahead (see the module docstring).
        disk_reads: ``"populate"`` (default): the reader thread maps the weights and reads
            their pages in, the module uses them in place (zero copy, no faults on the compute
            thread; measured fastest cold and warm); ``"advise"``: kernel read-ahead only, the
            module faults the pages in itself; ``"read"``: raw offload files read whole into
            fresh buffers on the reader thread (a copy out of the page cache).

    Attributes:
        hits, misses: modules whose weights were / were not prefetched when they ran.
        wait_s: seconds the forward spent waiting for the reader (zero when it keeps ahead).
    """

    def __init__(
        self, hooks: list[AlignDevicesHook], *, depth: int = 2, disk_reads: str = "populate"
    ) -> None:
        if disk_reads not in _DISK_READS:
            raise ValueError(f"disk_reads must be one of {_DISK_READS}, not {disk_reads!r}")
        if depth < 1:
            raise ValueError(f"depth must be at least 1, not {depth!r}")
        self.hooks = hooks
        self.depth = depth
        self.disk_reads = disk_reads
        self.successor: dict[int, AlignDevicesHook] = {}
        self._previous: AlignDevicesHook | None = None
        self._pending: dict[int, tuple[Any, dict[str, Tensor]]] = {}
        self._pinned: dict[int, tuple[Tensor, Tensor]] = {}  # id(slot) -> (stored, pinned)
        self._plans: dict[int, tuple[list, list[FileRange]]] = {}
        self._reads: dict[int, DiskJob] = {}
        self._advised: set[int] = set()
        self._header_cache: dict[str, Any] = {}
        self._streams: dict[torch.device, Any] = {}  # one side stream per CUDA device
        self._requests: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None
        self.hits = 0
        self.misses = 0
        self.wait_s = 0.0
        for hook in hooks:
            hook.prefetcher = self

    # -- called by AlignDevicesHook._onload ----------------------------------------------------

    def take(self, hook: AlignDevicesHook) -> dict[str, Tensor] | None:
        """Learn the order, return what was prefetched for ``hook``, fetch its successors."""
        previous, self._previous = self._previous, hook
        if previous is not None and previous is not hook:
            self.successor[id(previous)] = hook
        device = hook.device
        if device is not None and device.type == "cuda":
            ready = self._take_cuda(hook)
            following = self.successor.get(id(hook))
            for stale in [key for key in self._pending if key != id(following)]:
                del self._pending[stale]  # the order changed; side-stream frees are ordered
            if following is not None and following is not hook:
                self._fetch_cuda(following)
            return ready
        return self._take_disk(hook)

    # -- CPU execution: reads on the reader thread ---------------------------------------------

    def _take_disk(self, hook: AlignDevicesHook) -> dict[str, Tensor] | None:
        job = self._reads.pop(id(hook), None)
        self._fetch_disk(hook)  # queue the successors first: the reader never idles
        tensors = None
        if job is not None:
            start = time.perf_counter()
            tensors = job.wait()
            self.wait_s += time.perf_counter() - start
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
            if current is None or current is hook or id(current) in chain:
                break
            chain.add(id(current))
            if id(current) in self._reads:
                continue
            if self.disk_reads == "populate":
                slots = [slot for slot in current.slots if slot.source == "disk"]
                job: DiskJob | None = MapJob(slots) if slots else None
            else:
                raw, other = self._disk_plan(current)
                job = ReadJob(raw) if raw else None
                if other:
                    advice.extend(other)
                    self._advised.add(id(current))
            if job is not None:
                self._reads[id(current)] = job
                self._reader().put(job)
        for stale in [key for key in self._reads if key not in chain]:
            self._reads.pop(stale).cancel()  # the order changed: that read is never used
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
                    stored_dtype = lookup_dtype(info["dtype"]) or slot.dtype
                    raw.append((slot.name, path, nbytes, stored_dtype, tuple(info["shape"])))
            plan = self._plans[id(hook)] = (raw, other)
        return plan

    def _reader(self) -> queue.SimpleQueue:
        if self._requests is None:
            self._requests = queue.SimpleQueue()
            self._thread = threading.Thread(
                target=reader_loop, args=(self._requests,), name="workbench-prefetch", daemon=True
            )
            self._thread.start()
            weakref.finalize(self, self._requests.put, None)
        return self._requests

    def forget(self, hook: AlignDevicesHook) -> None:
        """Drop what was fetched, read or planned for ``hook`` (its weights_map was replaced)."""
        self._pending.pop(id(hook), None)
        self._plans.pop(id(hook), None)
        self._advised.discard(id(hook))
        for slot in hook.slots:
            self._pinned.pop(id(slot), None)
        job = self._reads.pop(id(hook), None)
        if job is not None:
            job.cancel()

    def discard(self) -> None:
        """Drop the prefetches not used yet and the memory they hold; the order stays learned."""
        jobs = list(self._reads.values())
        self._reads.clear()
        self._advised.clear()
        for job in jobs:
            job.cancel()
        for job in jobs:
            job.done.wait()
            job.tensors = None

    # -- CUDA execution: side-stream copies from pinned memory ---------------------------------

    def _pinned_source(self, slot: Any) -> Tensor:
        stored = slot.mapping[slot.key]
        if stored.device.type != "cpu":
            return stored
        if slot.stable:  # in-memory weights: pinned once, reused every forward
            cached = self._pinned.get(id(slot))
            if cached is None or cached[0] is not stored:  # a replaced weights_map: pin anew
                cached = self._pinned[id(slot)] = (stored, stored.pin_memory())
            return cached[1]
        return stored.pin_memory()  # disk weights: the caching host allocator recycles these

    def _fetch_cuda(self, hook: AlignDevicesHook) -> None:
        if id(hook) in self._pending:
            return
        device = hook.device
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        fetched: dict[str, Tensor] = {}
        with torch.cuda.stream(stream):
            for slot in hook.slots:
                if slot.tie is not None:
                    continue  # tied weights come from tied_params_map
                source = self._pinned_source(slot)
                fetched[slot.name] = source.to(device, dtype=slot.dtype, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        self._pending[id(hook)] = (event, fetched)

    def _take_cuda(self, hook: AlignDevicesHook) -> dict[str, Tensor] | None:
        pending = self._pending.pop(id(hook), None)
        if pending is None:
            self.misses += 1
            return None
        self.hits += 1
        event, fetched = pending
        current = torch.cuda.current_stream(hook.device)
        current.wait_event(event)
        for tensor in fetched.values():
            tensor.record_stream(current)  # memory stays reserved until compute is done
        return fetched

    def close(self) -> None:
        """Stop the reader thread and drop pinned copies and pending prefetches."""
        for job in self._reads.values():
            job.cancel()
        if self._requests is not None:
            self._requests.put(None)
            if self._thread is not None:
                self._thread.join(timeout=10)
            self._requests = self._thread = None
        self.discard()
        self._pending.clear()
        self._pinned.clear()
        for hook in self.hooks:
            if hook.prefetcher is self:
                hook.prefetcher = None

    def __repr__(self) -> str:
        return f"Prefetcher({len(self.hooks)} modules, {len(self.successor)} successors learned)"


def enable_prefetch(
    model: nn.Module, *, depth: int = 2, disk_reads: str = "populate"
) -> Prefetcher:
    """Prefetch the offloaded weights of ``model``'s modules (see the module docstring).

    Args:
        model: a model dispatched or offloaded with this package's hooks.
        depth: keyword-only; modules fetched ahead for disk reads.
        disk_reads: keyword-only; ``"populate"`` (default), ``"advise"`` or ``"read"``, see
            ``Prefetcher``.

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
