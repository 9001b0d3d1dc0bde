"""Bring a loaded model's memory-mapped CPU weights into the worker before its first run.

A CPU weight that keeps its dtype is loaded as a copy-on-write map of its safetensors file
(``load_checkpoint_in_model(mmap=True)``): no byte is read until the first forward touches it.
That forward then pays for every page: SmolLM2-135M's first chat turn on this project's 2-core
CPU paged in 267 MiB, and its time to first token was 2.3x the next turn's. The load paging
them in (``madvise(MADV_POPULATE_READ)``, one call per tensor, the GIL released) puts that time
where it belongs, in the load, so the first run's TTFT is what every run's is and what the speed
model predicts. The pages stay file-backed: the kernel may still reclaim them under pressure
(the worker's anonymous memory, which the memory model counts, does not change).

Example:
    >>> page_in_cpu_weights(model, progress=print, cancel=token)  # doctest: +SKIP
    280887296
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

from workbench.big_modeling.hooks.prefetch_reader import populate
from workbench.big_modeling.progress import CancelToken

__all__ = ["cpu_tensors", "page_in_cpu_weights"]


def cpu_tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    """Each plain CPU parameter and buffer of ``model`` once (tied ones once). A quantized
    weight (a tensor subclass such as torchao's) is skipped: it was computed into the worker's
    own memory, nothing maps it."""
    seen: set[int] = set()
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.device.type != "cpu" or tensor.numel() == 0:
            continue
        if type(tensor.data) is not torch.Tensor:
            continue
        pointer = tensor.data_ptr()
        if pointer in seen:
            continue
        seen.add(pointer)
        yield tensor


def page_in_cpu_weights(
    model: nn.Module,
    *,
    progress: Callable[[int, int], None] | None = None,
    cancel: CancelToken | None = None,
) -> int:
    """Populate the pages under every CPU tensor of ``model``; return their bytes.

    Args:
        model: a loaded model (its offloaded tensors are ``meta`` and skipped).
        progress: called with ``(bytes done, bytes total)`` after each tensor.
        cancel: checked before each tensor (``LoadCancelled``).
    """
    tensors = list(cpu_tensors(model))
    total = sum(t.numel() * t.element_size() for t in tensors)
    done = 0
    for tensor in tensors:
        if cancel is not None:
            cancel.raise_if_cancelled()
        populate(tensor)
        done += tensor.numel() * tensor.element_size()
        if progress is not None:
            progress(done, total)
    return total
