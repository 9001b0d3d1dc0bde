"""Dtype names users type (``fp16``, ``bfloat16``, ``float8_e4m3fn``) and their bytes."""

from __future__ import annotations

import torch

from workbench.big_modeling.errors import BadInputError

_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp64": "float64",
    "double": "float64",
    "fp8": "float8_e4m3fn",
    "int4": "int4",
}


def parse_dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    """Return the ``torch.dtype`` for a name (``"fp16"``, ``"torch.bfloat16"``) or ``None``.

    Raises:
        BadInputError: for a name that is not a torch dtype, listing the usual ones.

    Example:
        >>> parse_dtype("bf16")
        torch.bfloat16
    """
    if value is None or isinstance(value, torch.dtype):
        return value
    text = str(value).strip().lower().removeprefix("torch.")
    if text in ("", "auto", "none"):
        return None
    text = _ALIASES.get(text, text)
    candidate = getattr(torch, text, None)
    if isinstance(candidate, torch.dtype):
        return candidate
    raise BadInputError(
        f"{value!r} is not a dtype; use one of float32, float16, bfloat16, float8_e4m3fn, int8"
    )


def dtype_name(dtype: torch.dtype | None) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``; ``None`` -> ``"as stored"``."""
    return "as stored" if dtype is None else str(dtype).removeprefix("torch.")
