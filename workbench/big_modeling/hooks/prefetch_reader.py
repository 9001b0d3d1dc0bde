"""The prefetch reader thread and what it reads: one module's disk tensors per job.

``MapJob`` (the default) takes a module's tensors from its weights map (memory maps of the
offload files) and reads their pages in with ``populate``; ``ReadJob`` reads raw ``.dat`` files
whole into fresh buffers; a list of file ranges is advice for the kernel's read-ahead. Jobs run
one at a time in the order queued, so the disk reads modules in execution order.

Example:
    >>> import torch
    >>> populate(torch.ones(4))  # a no-op for memory that is already in place
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import queue
import sys
import threading
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from workbench.big_modeling.loading.safetensors_header import read_safetensors_header
from workbench.big_modeling.offload.folder import raw_weight_path

if TYPE_CHECKING:
    from workbench.big_modeling.hooks.align import AlignDevicesHook

logger = logging.getLogger(__name__)

FileRange = tuple[str, int, int]  # path, offset, nbytes


def _safetensors_offsets(
    path: str, cache: dict[str, dict[str, tuple[int, int]]]
) -> dict[str, tuple[int, int]]:
    """``{tensor name: (absolute offset, nbytes)}`` from a safetensors header (read once)."""
    found = cache.get(path)
    if found is None:
        # the one header reader: its 100 MiB cap, JSON limits and layout checks apply here too
        header = read_safetensors_header(path)
        found = {
            name: (header.data_start + entry.data_offsets[0], entry.nbytes)
            for name, entry in header.entries.items()
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
            path = str(raw_weight_path(mapping.save_folder, key))
            ranges.append((path, 0, os.path.getsize(path), slot))
    return ranges


class DiskJob:
    """One module's disk tensors, fetched by the reader thread; ``wait()`` for the result."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.tensors: dict[str, Tensor] | None = None
        self.cancelled = False

    def cancel(self) -> None:
        """Skip the fetch if it has not started (a running one finishes)."""
        self.cancelled = True

    def fetch(self) -> dict[str, Tensor]:
        raise NotImplementedError

    def run(self) -> None:
        try:
            if not self.cancelled:
                self.tensors = self.fetch()
        except Exception as exc:  # the forward falls back to its own read, which reports it
            logger.debug("prefetch failed: %s", exc)
        finally:
            self.done.set()

    def wait(self) -> dict[str, Tensor] | None:
        self.done.wait()
        return self.tensors


class ReadJob(DiskJob):
    """Whole-file reads of one module's raw offloaded tensors into fresh buffers."""

    def __init__(self, entries: list[tuple[str, str, int, torch.dtype, tuple[int, ...]]]) -> None:
        super().__init__()
        self.entries = entries  # (slot name, path, nbytes, dtype, shape)

    def fetch(self) -> dict[str, Tensor]:
        tensors = {}
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
        return tensors


class MapJob(DiskJob):
    """One module's disk tensors from its weights map (memory maps), read in on this thread.

    Tensors whose pages are all in the page cache are left to the module's (minor) page faults:
    populating them here would cost the same CPU on a third thread, which slows a forward that
    already uses every core.
    """

    def __init__(self, slots: list[Any]) -> None:
        super().__init__()
        self.slots = slots

    def fetch(self) -> dict[str, Tensor]:
        tensors = {}
        for slot in self.slots:
            tensor = slot.mapping[slot.key]
            if not is_cached(tensor):
                populate(tensor)
            tensors[slot.name] = tensor
        return tensors


_MADV_POPULATE_READ = 22  # Linux >= 5.14
_fadvise = getattr(os, "posix_fadvise", None)
_madvise: Any = None
_mincore: Any = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(None, use_errno=True)  # ctypes calls release the GIL
        _madvise, _mincore = _libc.madvise, _libc.mincore
        _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    except (OSError, AttributeError):
        _madvise = _mincore = None


def _pages(tensor: Tensor) -> tuple[int, int]:
    """Page-aligned ``(start, length)`` of the memory under a CPU tensor (0 length: none)."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0 or tensor.device.type != "cpu":
        return 0, 0
    start = tensor.data_ptr() & ~(mmap.PAGESIZE - 1)
    end = -(-(tensor.data_ptr() + nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE
    return start, end - start


def is_cached(tensor: Tensor) -> bool:
    """Whether every page under ``tensor`` is in memory (``mincore``; False when unknown)."""
    start, length = _pages(tensor)
    if not length:
        return True
    if _mincore is None:
        return False
    npages = length // mmap.PAGESIZE
    vector = ctypes.create_string_buffer(npages)
    if _mincore(start, length, vector) != 0:
        return False
    return vector.raw[:npages].count(1) == npages


def populate(tensor: Tensor) -> None:
    """Bring a CPU tensor's pages (of a memory-mapped file: from disk) into this process.

    One ``madvise(MADV_POPULATE_READ)`` where the kernel has it; otherwise one element of
    every page is read by a torch op (which releases the GIL too).
    """
    global _madvise
    start, length = _pages(tensor)
    if not length:
        return
    if _madvise is not None:
        if _madvise(start, length, _MADV_POPULATE_READ) == 0:
            return
        if ctypes.get_errno() == errno.EINVAL:  # an older kernel: touch pages from now on
            _madvise = None
    if tensor.is_contiguous():
        step = max(1, mmap.PAGESIZE // tensor.element_size())
        tensor.reshape(-1)[::step].clone()


def reader_loop(requests: queue.SimpleQueue) -> None:
    """Background reader: ``DiskJob``s, or page-cache advice (lists of file ranges)."""
    while True:
        item = requests.get()
        if item is None:
            return
        if isinstance(item, DiskJob):
            item.run()
        elif _fadvise is not None:  # page-cache advice needs posix_fadvise (not on macOS)
            for path, offset, nbytes in item:
                try:
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        _fadvise(fd, offset, nbytes, os.POSIX_FADV_WILLNEED)
                    finally:
                        os.close(fd)
                except OSError as exc:  # a hint: the forward reads the file anyway
                    logger.debug("prefetch of %s failed: %s", path, exc)
        del item  # hold no fetched tensors while waiting for the next request
