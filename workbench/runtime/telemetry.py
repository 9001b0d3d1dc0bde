"""Telemetry: fixed-size ring buffers, the worker's memory sampler, the transfer recorder.

Memory never grows with run length: every buffer is a numpy array allocated once. Reads are
cheap snapshots (one copy under a lock) so GUI plots can poll them at 10 Hz.

``RingBuffer`` lives in ``ring_buffer.py`` and the transfer parts in ``transfer_history.py``;
both are re-exported here. Worker side: ``MemorySampler`` (a thread producing ``TelemetrySample``) and
``TransferRecorder`` (installed as the engine's transfer recorder, drained once per forward).
Host side: ``MemoryHistory`` and ``TransferHistory`` keep the last N samples / events; the
``WorkerHost`` feeds them before calling its event callback.

Example:
    >>> buf = RingBuffer(3, width=2)
    >>> for i in range(5):
    ...     buf.append((i, 10 * i))
    >>> buf.snapshot().tolist()
    [[2.0, 20.0], [3.0, 30.0], [4.0, 40.0]]
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from workbench.runtime.protocol import CudaMemory, TelemetrySample
from workbench.runtime.ring_buffer import RingBuffer
from workbench.runtime.transfer_history import (
    TRANSFER_COLUMNS,
    TransferHistory,
    TransferRecorder,
    group_layers,
    summarize_layers,
)

__all__ = [
    "CUDA_COLUMNS",
    "DEFAULT_SAMPLE_HZ",
    "MEMORY_COLUMNS",
    "TRANSFER_COLUMNS",
    "MemoryHistory",
    "MemorySampler",
    "RingBuffer",
    "TransferHistory",
    "TransferRecorder",
    "group_layers",
    "read_process_memory",
    "summarize_layers",
    "take_memory_sample",
]

logger = logging.getLogger(__name__)

DEFAULT_SAMPLE_HZ = 10.0


# ------------------------------------------------------------------------------------------
# Memory: host-side history and the worker-side sampler
# ------------------------------------------------------------------------------------------

MEMORY_COLUMNS = ("time_s", "rss_bytes", "available_bytes", "file_backed_bytes")
CUDA_COLUMNS = ("time_s", "allocated_bytes", "reserved_bytes", "nvml_used_bytes")


class MemoryHistory:
    """The last ``capacity`` memory samples: one host buffer, one buffer per CUDA device.

    ``host.snapshot()`` has columns ``MEMORY_COLUMNS`` (``file_backed_bytes`` is NaN where the
    platform does not report it); ``cuda(0).snapshot()`` has ``CUDA_COLUMNS``
    (``nvml_used_bytes`` is NaN without NVML). GPU series appear only after a
    sample mentions that device, so on CPU-only machines ``cuda_devices()`` stays empty.
    """

    def __init__(self, capacity: int = 3000) -> None:
        self.capacity = capacity
        self.host = RingBuffer(capacity, width=len(MEMORY_COLUMNS))
        self._cuda: dict[int, RingBuffer] = {}
        self._lock = threading.Lock()

    def add(self, sample: TelemetrySample) -> None:
        file_backed = sample.file_backed_bytes
        self.host.append(
            (
                sample.time_s,
                sample.rss_bytes,
                sample.available_bytes,
                float("nan") if file_backed is None else file_backed,
            )
        )
        for mem in sample.cuda:
            buf = self._cuda.get(mem.device)
            if buf is None:
                with self._lock:
                    buf = self._cuda.setdefault(
                        mem.device, RingBuffer(self.capacity, width=len(CUDA_COLUMNS))
                    )
            nvml = float("nan") if mem.nvml_used_bytes is None else mem.nvml_used_bytes
            buf.append((sample.time_s, mem.allocated_bytes, mem.reserved_bytes, nvml))

    def cuda_devices(self) -> list[int]:
        with self._lock:
            return sorted(self._cuda)

    def cuda(self, device: int) -> RingBuffer:
        """Return device ``device``'s buffer. Raises ``KeyError`` if it was never sampled."""
        with self._lock:
            return self._cuda[device]

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self.host.nbytes + sum(b.nbytes for b in self._cuda.values())


class _Nvml:
    """Optional NVML access (``nvidia-ml-py``); silently absent when not installed."""

    def __init__(self) -> None:
        self._handles: dict[int, object] = {}
        self._lib = None
        try:
            import pynvml  # noqa: PLC0415 (optional; NVML only on GPU machines)

            pynvml.nvmlInit()
            self._lib = pynvml
        except Exception:  # not installed, no driver: the NVML series are simply absent
            self._lib = None

    def used_bytes(self, device: int) -> int | None:
        if self._lib is None:
            return None
        try:
            handle = self._handles.get(device)
            if handle is None:
                # NVML numbers devices physically; map through CUDA_VISIBLE_DEVICES if set
                visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
                ids = [v for v in visible.split(",") if v.strip().isdigit()]
                physical = int(ids[device]) if device < len(ids) else device
                handle = self._lib.nvmlDeviceGetHandleByIndex(physical)
                self._handles[device] = handle
            return int(self._lib.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception:
            return None


_PROC_STATUS = "/proc/self/status"


def read_process_memory(status_path: str = _PROC_STATUS) -> tuple[int, int | None]:
    """Return this process's ``(rss_bytes, file_backed_bytes)``.

    On Linux both come from one read of ``/proc/self/status``: ``VmRSS`` and ``RssFile``, the
    resident pages of mapped files (memory-mapped weights and checkpoints, shared libraries).
    They count in RSS, yet the kernel can drop them under pressure (read-only weights are
    clean). ``RssShmem`` (tmpfs, ``/dev/shm``, shared anonymous memory), which psutil's
    ``shared`` adds, is left out: it can only be swapped, not dropped. Elsewhere (no such
    file, or a kernel before 4.5 without ``RssFile``) ``file_backed_bytes`` is ``None``.

    Example:
        >>> rss, file_backed = read_process_memory()
        >>> file_backed is None or file_backed <= rss
        True
    """
    try:
        with open(status_path, "rb") as status:
            text = status.read()
    except OSError:
        text = b""
    rss = _status_bytes(text, b"VmRSS:")
    if rss is None:
        import psutil  # noqa: PLC0415 (only where /proc is missing)

        return int(psutil.Process().memory_info().rss), None
    return rss, _status_bytes(text, b"RssFile:")


def _status_bytes(text: bytes, key: bytes) -> int | None:
    """Parse ``<key>  1234 kB`` out of ``/proc/<pid>/status`` text; ``None`` if absent."""
    if text.startswith(key):
        start = 0
    else:
        start = text.find(b"\n" + key) + 1  # a whole key, not the end of a longer one
        if start == 0:
            return None
    end = text.find(b"\n", start + 1)
    fields = text[start + len(key) : end if end >= 0 else len(text)].split()
    try:
        return int(fields[0]) * 1024  # the kernel writes kB meaning KiB
    except (IndexError, ValueError):
        return None


def take_memory_sample(nvml: _Nvml | None = None) -> TelemetrySample:
    """Measure this process's RSS (and its file-backed part), the system's available RAM and
    each CUDA device now."""
    import psutil  # noqa: PLC0415 (kept off the GUI's import of the runtime)

    rss, file_backed = read_process_memory()
    available = psutil.virtual_memory().available
    cuda: list[CudaMemory] = []
    torch = _torch_if_cuda()
    if torch is not None:
        for index in range(torch.cuda.device_count()):
            cuda.append(
                CudaMemory(
                    device=index,
                    allocated_bytes=int(torch.cuda.memory_allocated(index)),
                    reserved_bytes=int(torch.cuda.memory_reserved(index)),
                    nvml_used_bytes=nvml.used_bytes(index) if nvml is not None else None,
                    total_bytes=int(torch.cuda.get_device_properties(index).total_memory),
                )
            )
    return TelemetrySample(
        time_s=time.time(),
        rss_bytes=rss,
        available_bytes=int(available),
        cuda=tuple(cuda),
        file_backed_bytes=file_backed,
    )


def _torch_if_cuda():  # type: ignore[no-untyped-def]
    """Return torch when it is imported and a job has initialised CUDA, else None.

    The sampler never imports torch nor creates a CUDA context itself (a context costs hundreds
    of MiB of GPU memory): an idle worker stays light, and GPU series start with the first job
    that uses the GPU.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch if torch.cuda.is_initialized() else None
    except Exception:
        return None


class MemorySampler:
    """A daemon thread calling ``emit(TelemetrySample)`` at ``rate_hz`` until ``stop()``.

    Example:
        >>> samples = []
        >>> sampler = MemorySampler(samples.append, rate_hz=50)
        >>> sampler.start(); sampler.stop()
    """

    def __init__(
        self, emit: Callable[[TelemetrySample], None], rate_hz: float = DEFAULT_SAMPLE_HZ
    ) -> None:
        if rate_hz <= 0:
            raise ValueError(f"rate_hz must be > 0, got {rate_hz}")
        self._emit = emit
        self.period_s = 1.0 / rate_hz
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples_taken = 0

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        nvml = _Nvml()
        next_s = time.monotonic()
        while not self._stop.is_set():
            try:
                self._emit(take_memory_sample(nvml))
                self.samples_taken += 1
            except Exception:  # a closed pipe at exit, a transient psutil error
                logger.debug("memory sample failed", exc_info=True)
                if self._stop.is_set():
                    return
            next_s += self.period_s
            delay = next_s - time.monotonic()
            if delay < 0:  # fell behind (a busy machine): skip, do not burst
                next_s = time.monotonic()
                delay = 0.0
            self._stop.wait(delay)
