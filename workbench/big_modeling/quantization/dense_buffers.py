"""One dense buffer per thread and compute dtype, which quantized CPU matmuls dequantize into.

A weight-only quantized matmul on the CPU computes with a dense copy of its weight: bitsandbytes'
nf4/fp4 (``bnb4_cpu``) and torchao's int8 (``int8_cpu``) dequantize the whole weight, then run
one dense matmul. Allocated anew for each call, those copies (1.7 MiB each for SmolLM2-135M's MLP
weights in bfloat16) fragment glibc's heap between the activations under its dynamic mmap
threshold: SmolLM2 runs peaked 15-86 MiB above their live tensors (issue 21). Here each thread
keeps one buffer per compute dtype, grown to the largest weight it has run and kept, so a run
holds exactly what ``dequantize_buffer_nbytes`` predicts. A buffer lives until its thread ends or
``release_dequantize_buffers`` (the worker calls it when it drops a model).

Example:
    >>> dense = dense_buffer(64 * 128, torch.bfloat16).view(64, 128)
    >>> held_dequantize_buffer_bytes() >= 64 * 128 * 2
    True
    >>> release_dequantize_buffers()
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from math import prod

import torch

__all__ = [
    "DENSE_COPY_KINDS",
    "dense_buffer",
    "dequantize_buffer_nbytes",
    "held_dequantize_buffer_bytes",
    "release_dequantize_buffers",
]


DENSE_COPY_KINDS = ("nf4", "fp4", "int8")
"""Precision kinds whose matmul computes with a dense copy of the weight: bitsandbytes' nf4/fp4
and torchao's int8 weight-only (``Int8Tensor`` casts the weight for each matmul); on the CPU
the copy is made into this module's buffers (``bnb4_cpu``, ``int8_cpu``)."""


class _Buffers:
    """One thread's dequantize buffers, by compute dtype (weak-referenceable for the registry)."""

    def __init__(self) -> None:
        self.by_dtype: dict[torch.dtype, torch.Tensor] = {}


_local = threading.local()
_registry: weakref.WeakSet[_Buffers] = weakref.WeakSet()  # every live thread's buffers
_registry_lock = threading.Lock()


def _buffers() -> _Buffers:
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = _Buffers()
        with _registry_lock:
            _registry.add(buffers)
    return buffers


def dense_buffer(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """This thread's buffer for ``dtype``, its first ``numel`` elements (grown, never shrunk)."""
    held = _buffers().by_dtype
    buffer = held.get(dtype)
    if buffer is None or buffer.numel() < numel:
        held.pop(dtype, None)  # the old one goes before the new one is allocated
        buffer = held[dtype] = torch.empty(numel, dtype=dtype)
    return buffer[:numel]


def held_dequantize_buffer_bytes() -> int:
    """Bytes of the dequantize buffers every live thread holds now."""
    with _registry_lock:
        owners = list(_registry)
    return sum(t.numel() * t.element_size() for b in owners for t in list(b.by_dtype.values()))


def release_dequantize_buffers() -> None:
    """Drop every thread's buffers (a matmul running now keeps its own until it returns)."""
    with _registry_lock:
        owners = list(_registry)
    for owner in owners:
        owner.by_dtype.clear()


def dequantize_buffer_nbytes(weights: Iterable[tuple[tuple[int, ...], torch.dtype]]) -> int:
    """Bytes the buffers hold after a CPU run of these quantized weights: per compute dtype, its
    largest 2-D weight (an expert of a 3-D one) at that dtype's size.

    Args:
        weights: ``(shape, compute dtype)`` of each nf4/fp4/int8 weight the CPU runs.

    Example:
        >>> dequantize_buffer_nbytes([((1536, 576), torch.bfloat16), ((576, 576), torch.bfloat16)])
        1769472
        >>> dequantize_buffer_nbytes([((8, 64, 32), torch.float32), ((10, 10), torch.float16)])
        8392
    """
    largest: dict[torch.dtype, int] = {}
    for shape, dtype in weights:
        numel = prod(shape[-2:])
        largest[dtype] = max(largest.get(dtype, 0), numel * dtype.itemsize)
    return sum(largest.values())
