"""Bytes per element of each torch dtype, and the dtype names size accounting accepts.

The lowest layer of planning: ``sizes`` (the public size accounting), ``module_index`` (the
preorder index the planner runs on) and ``activation_reserve`` all count bytes with these.

Example:
    >>> dtype_byte_size(torch.float16), element_nbytes(torch.bool)
    (2, 1)
"""

from __future__ import annotations

import torch

from workbench.big_modeling.dtypes import to_dtype

__all__ = ["as_dtype", "dtype_byte_size", "element_nbytes"]

_SUB_BYTE_BITS = {f"int{bits}": bits for bits in range(1, 8)} | {
    f"uint{bits}": bits for bits in range(1, 8)
}


def dtype_byte_size(dtype: torch.dtype) -> int | float:
    """Bytes per element of ``dtype``, as the reference counts them.

    Sub-byte integer dtypes (``torch.uint4``, ``torch.int2``...) give fractions (``0.5``);
    fp8 dtypes give ``1``; packed dtypes such as ``torch.float4_e2m1fn_x2`` give the bytes of one
    packed element (``1``); ``torch.bool`` gives ``1/8`` (one bit), as in the reference. The
    planner's own accounting uses ``element_nbytes``, which counts the byte PyTorch really
    stores per bool.

    Example:
        >>> dtype_byte_size(torch.bfloat16), dtype_byte_size(torch.uint4), dtype_byte_size(torch.bool)
        (2, 0.5, 0.125)
    """
    if dtype == torch.bool:
        return 1 / 8
    return element_nbytes(dtype)


def element_nbytes(dtype: torch.dtype) -> int | float:
    """Bytes one element of ``dtype`` takes in memory (``torch.bool``: 1, its real storage).

    Example:
        >>> element_nbytes(torch.bool), element_nbytes(torch.uint4)
        (1, 0.5)
    """
    bits = _SUB_BYTE_BITS.get(str(dtype).removeprefix("torch."))
    if bits is not None:
        return bits / 8
    return dtype.itemsize


def as_dtype(value: torch.dtype | str) -> torch.dtype:
    """Accept ``torch.float16``, ``"float16"``, ``"torch.float16"`` or an alias (``"fp16"``).

    The app's one dtype vocabulary, ``workbench.big_modeling.dtypes.to_dtype``.

    Raises:
        BadInputError: for a string that names no torch dtype.
    """
    return to_dtype(value)
