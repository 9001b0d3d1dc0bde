"""Exact fp8 up-casts, faster than ``Tensor.to``.

- CUDA: a Triton kernel for float8_e4m3fn -> bf16/fp16 (integer bit arithmetic; every e4m3fn
  value is exact in both, so the result is bit-identical to ``Tensor.to``, NaN payloads aside).
- CPU: a table look-up, two codes at a time, for any one-byte float -> any float dtype,
  bit-identical to ``Tensor.to`` by construction. PyTorch's CPU cast is a scalar loop (~6 ns per
  element: ~100 ms for a 4096x4096 weight, against 12-14 ms here).
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Any

import torch

# e4m3fn -> wide float, exact, as integer bit arithmetic: (mantissa bits, exponent bias - 7, NaN)
_FP8_UPCAST_FORMATS: dict[torch.dtype, tuple[int, int, int]] = {
    torch.bfloat16: (7, 120, 0x7FC0),
    torch.float16: (10, 8, 0x7E00),
}
_UPCAST_BLOCK = 4096
_FAST_UPCAST_MIN_NUMEL = 1 << 22  # 4M elements: the kernel saves >= 6 us of GPU time there
triton_failure: list[Exception] = []  # why the Triton kernel could not run in this process


@functools.cache
def _fp8_upcast_kernel() -> Any:
    """A Triton kernel for float8_e4m3fn -> bf16/fp16, or None without Triton.

    PyTorch's cast runs a scalar software conversion (~1 TB/s on an H200: 53 us for a 4096x4096
    weight); this one is pure integer bit arithmetic and memory-bound. Every e4m3fn value is
    exactly representable in bf16 and fp16, so the result is bit-identical to ``Tensor.to``
    (NaN payloads aside).
    """
    try:
        import triton  # noqa: PLC0415 (optional, heavy: only when an fp8 upcast runs on CUDA)
        import triton.language as tl  # noqa: PLC0415 (optional, as above)
    except ImportError:
        return None

    @triton.jit
    def upcast(
        src,
        dst,
        numel,
        MB: tl.constexpr,  # noqa: N803  (compile-time constants in capitals, Triton style)
        BD: tl.constexpr,  # noqa: N803
        NAN: tl.constexpr,  # noqa: N803
        BLOCK: tl.constexpr,  # noqa: N803
    ):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < numel
        code = tl.load(src + offsets, mask=mask, other=0).to(tl.int32)
        sign = (code & 0x80) << 8
        magnitude = code & 0x7F
        exponent = magnitude >> 3
        mantissa = magnitude & 7
        normal = ((exponent + BD) << MB) | (mantissa << (MB - 3))
        # subnormal e4m3 (exponent 0): mantissa * 2**-9, normal in the wide format
        lead = tl.where(mantissa >= 4, 2, tl.where(mantissa >= 2, 1, 0))
        fraction = ((mantissa - (1 << lead)) << (MB - lead)) & ((1 << MB) - 1)
        subnormal = tl.where(mantissa == 0, 0, ((lead + BD - 2) << MB) | fraction)
        bits = tl.where(exponent == 0, subnormal, normal)
        bits = tl.where(magnitude == 0x7F, NAN, bits) | sign
        tl.store(dst + offsets, bits.to(tl.int16), mask=mask)

    return upcast


def fp8_upcast_triton(stored: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor | None:
    """Up-cast a contiguous CUDA ``float8_e4m3fn`` tensor with the Triton kernel.

    Returns None when Triton is missing, cannot run here (``triton_failure`` says why; it is
    not tried again), or the tensor or dtype does not qualify.
    """
    if (
        stored.dtype != torch.float8_e4m3fn
        or not stored.is_cuda
        or compute_dtype not in _FP8_UPCAST_FORMATS
        or not stored.is_contiguous()
        or triton_failure
    ):
        return None
    kernel = _fp8_upcast_kernel()
    if kernel is None:
        return None
    out = torch.empty(stored.shape, dtype=compute_dtype, device=stored.device)
    numel = stored.numel()
    if numel:
        mb, bd, nan = _FP8_UPCAST_FORMATS[compute_dtype]
        grid = (-(-numel // _UPCAST_BLOCK),)
        try:
            with torch.cuda.device(stored.device):  # Triton launches on the current device
                kernel[grid](
                    stored.view(torch.uint8),
                    out.view(torch.int16),
                    numel,
                    mb,
                    bd,
                    nan,
                    _UPCAST_BLOCK,
                )
        except Exception as exc:  # e.g. no C compiler to build Triton's launcher, an old GPU
            triton_failure.append(exc)
            warnings.warn(
                f"fp8 up-cast: the Triton kernel cannot run here ({exc}); using Tensor.to, "
                "which is exact but slower. Install a C compiler (Triton builds its launcher "
                "with one) or pass fp8_kernel='never' to silence this.",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
    return out


# CPU: a one-byte float has 256 codes, so the up-cast is a table look-up with no float arithmetic
# (nothing depends on denormal flushing), exact by construction: the table holds the values
# PyTorch's own cast gives, NaN payloads and -0 included. Two codes are looked up at once: the
# source read as 16-bit words indexes a 65,536-entry table of both results packed in one wider
# integer (256 KiB for 2-byte results, 512 KiB for 4-byte ones: it stays in L2). That halves the
# gathers: 12-14 ms per 4096x4096 weight against 30-37 ms with the 256-entry table. Chunk by chunk,
# so the int32 indices take 4 MiB, not 4 bytes per code of the weight; 1M-word chunks were the
# fastest on one and on two threads (64K: 16 ms, 4M: 14-16 ms).
_CPU_CHUNK_NUMEL = 1 << 21  # codes per chunk (1M words)
_PACKED_INT = {2: torch.int32, 4: torch.int64}  # result element size -> a two-result integer


@functools.cache
def _byte_float_table(storage_dtype: torch.dtype, compute_dtype: torch.dtype) -> torch.Tensor:
    codes = torch.arange(256, dtype=torch.uint8).view(storage_dtype)
    return codes.to(compute_dtype)  # (256,) compute_dtype


@functools.cache
def _byte_pair_table(storage_dtype: torch.dtype, compute_dtype: torch.dtype) -> torch.Tensor:
    """(65536,) integers: entry ``lo | hi << 8`` holds the results for codes ``lo``, ``hi``."""
    single = _byte_float_table(storage_dtype, compute_dtype)
    pairs = torch.stack((single.repeat(256), single.repeat_interleave(256)), dim=1)
    return pairs.contiguous().view(_PACKED_INT[single.element_size()]).reshape(-1)


def _pairs_fit(values: torch.Tensor) -> bool:
    return (
        sys.byteorder == "little"
        and values.element_size() in _PACKED_INT
        and values.numel() % 2 == 0
        and values.storage_offset() % 2 == 0
    )


def fp8_upcast_cpu_into(stored: torch.Tensor, out: torch.Tensor) -> bool:
    """Up-cast a CPU one-byte float tensor (fp8) into ``out``: same shape and strides, any
    floating dtype.

    Bit-identical to ``out.copy_(stored)`` and ~3x faster on a 4096x4096 weight (PyTorch's fp8
    conversion is a scalar loop, ~6 ns per element). Returns False, with ``out`` untouched, when
    the tensors do not qualify (then copy instead).
    """
    if (
        stored.element_size() != 1
        or not stored.is_floating_point()
        or not out.is_floating_point()
        or stored.device.type != "cpu"
        or out.device.type != "cpu"
        or out.shape != stored.shape
        or out.stride() != stored.stride()
    ):
        return False
    # dims by decreasing stride: a dense tensor, transposed or not, becomes contiguous
    order = sorted(range(stored.dim()), key=lambda dim: -stored.stride(dim))
    src, dst = stored.permute(order), out.permute(order)
    if not (src.is_contiguous() and dst.is_contiguous()):
        return False
    codes, values = src.reshape(-1).view(torch.uint8), dst.reshape(-1)
    if _pairs_fit(values) and codes.storage_offset() % 2 == 0:
        codes = codes.view(torch.uint16)
        table = _byte_pair_table(stored.dtype, out.dtype)
        values = values.view(table.dtype)
    else:
        table = _byte_float_table(stored.dtype, out.dtype)
    chunk_numel = _CPU_CHUNK_NUMEL // 2 if table.numel() > 256 else _CPU_CHUNK_NUMEL
    indices = torch.empty(min(codes.numel(), chunk_numel), dtype=torch.int32)
    for start in range(0, codes.numel(), chunk_numel):
        chunk = codes[start : start + chunk_numel]
        chunk_indices = indices[: chunk.numel()]
        chunk_indices.copy_(chunk)
        torch.index_select(table, 0, chunk_indices, out=values[start : start + chunk.numel()])
    return True
