"""A 4-bit weight's CPU matmul through one reused buffer: bitsandbytes' kernels, no heap churn.

bitsandbytes 0.50 runs a canonical-layout nf4/fp4 weight on the CPU as "dequantize the whole
weight into a new tensor, then ``linear``", every call, prefill and decode. Under glibc's dynamic
mmap threshold those per-call blocks (1.7 MiB each for SmolLM2-135M's MLP weights) fragment the
heap between the activations: an nf4 SmolLM2 run on the CPU peaked 25 MiB above its baseline for
an 8-token prefill and 86 MiB after 16 decode steps of a 200-token prompt, against 1.7 and
10.6 MiB of live tensors (``MALLOC_MMAP_THRESHOLD_=131072`` gives the live figure, at a third of
the decode speed). That was the -15% to -30% of every nf4 CPU run's reconciliation (issue 21).

Here each thread dequantizes into its one buffer per compute dtype (``dense_buffers``, shared
with torchao's int8 weights, ``int8_cpu``), grown to the largest weight it has run and kept: the
run's extra memory is that buffer, which the memory model predicts exactly
(``dense_buffers.dequantize_buffer_nbytes``), and the decode speed is bitsandbytes' own (the same
kernels; 7.2-7.6 tok/s both ways on that model, this 2-core AVX2 CPU). The dequantize kernel is
bitsandbytes' native CPU one (``cdequantize_blockwise_cpu_{nf4,fp4}_{fp32,bf16,fp16}``, the
functions its ``dequantize_4bit`` CPU op calls, which has no ``out=`` form on the CPU); where that
op itself falls back (odd last dimension; AVX-512 with blocks of 2048 or more) or the native
library is missing, the op's result is copied into the buffer.

On CUDA nothing here runs: ``bnb4`` calls ``bitsandbytes.matmul_4bit`` (a fused one-token kernel
and the caching allocator).

Example:
    >>> weight = quantize_4bit(torch.randn(64, 128, dtype=torch.bfloat16), "nf4")  # doctest: +SKIP
    >>> linear_4bit_cpu(torch.ones(2, 128, dtype=torch.bfloat16), weight, None).shape  # doctest: +SKIP
    torch.Size([2, 64])
"""

from __future__ import annotations

import ctypes
import functools
from math import prod
from typing import Any

import torch

from workbench.big_modeling.quantization.dense_buffers import dense_buffer

__all__ = ["dequantize_4bit_into", "linear_4bit_cpu"]

_KERNEL_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_AVX512_FALLBACK_BLOCKSIZE = 2048  # bitsandbytes' CPU op computes these blocks in torch instead


@functools.cache
def _native_kernel(quant_type: str, dtype: torch.dtype) -> Any:
    """bitsandbytes' native CPU dequantize function for this format and dtype, or ``None``
    (looked up once: every 4-bit CPU matmul asks)."""
    try:
        from bitsandbytes.cextension import ErrorHandlerMockBNBNativeLibrary, lib  # noqa: PLC0415 (optional and heavy)
    except ImportError:
        return None
    suffix = _KERNEL_DTYPES.get(dtype)
    if isinstance(lib, ErrorHandlerMockBNBNativeLibrary) or suffix is None:
        return None
    return getattr(lib, f"cdequantize_blockwise_cpu_{quant_type}_{suffix}", None)


def _float_absmax(weight: Any) -> torch.Tensor:
    """The per-block scales as float32 (a nested weight's dequantized first, as bitsandbytes'
    ``dequantize_4bit`` does)."""
    if not weight.nested:
        return weight.absmax.float().contiguous()
    from bitsandbytes import functional  # noqa: PLC0415 (optional and heavy)

    state = weight.quant_state()
    return (functional.dequantize_blockwise(state.absmax, state.state2) + state.offset).float()


@functools.cache
def _avx512() -> bool:
    """Whether torch dispatches to AVX-512 here (bitsandbytes' CPU op then computes blocks of
    2048 or more in torch)."""
    return torch.backends.cpu.get_cpu_capability() == "AVX512"


def dequantize_4bit_into(weight: Any, out: torch.Tensor) -> torch.Tensor:
    """Dequantize a 2-D CPU ``Bnb4bitTensor`` into ``out`` (contiguous, ``weight``'s shape and
    dtype) with bitsandbytes' CPU kernel; returns ``out``."""
    rows, columns = weight.weight_shape
    kernel = _native_kernel(weight.quant_type, weight.dtype)
    fallback = (
        kernel is None
        or columns % 2
        or (_avx512() and weight.blocksize >= _AVX512_FALLBACK_BLOCKSIZE)
    )
    if fallback:
        return out.copy_(weight.dequantize())
    packed = weight.packed.reshape(-1).view(torch.uint8).contiguous()
    absmax = _float_absmax(weight)
    kernel(
        ctypes.c_void_p(packed.data_ptr()),
        ctypes.c_void_p(absmax.data_ptr()),
        ctypes.c_void_p(out.data_ptr()),
        ctypes.c_longlong(weight.blocksize),
        ctypes.c_longlong(rows),
        ctypes.c_longlong(columns),
    )
    return out


def linear_4bit_cpu(
    activation: torch.Tensor, weight: Any, bias: torch.Tensor | None
) -> torch.Tensor:
    """``linear(activation, weight, bias)`` for a 2-D CPU ``Bnb4bitTensor``: the weight is
    dequantized into this thread's buffer, then one dense ``linear``."""
    if activation.dtype != weight.dtype:
        activation = activation.to(weight.dtype)
    shape = weight.weight_shape
    dense = dense_buffer(prod(shape), weight.dtype).view(shape)
    return torch.nn.functional.linear(activation, dequantize_4bit_into(weight, dense), bias)
