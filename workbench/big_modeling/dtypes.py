"""The one dtype vocabulary of the app: the names users type (``fp16``, ``bfloat16``,
``torch.float8_e4m3fn``), the ones files store, and the choices the CLI and the GUI offer.

Every parser of a dtype name (the engine's loaders and offload index, the models, the runtime,
the CLI and the GUI) goes through ``to_dtype`` / ``parse_dtype``, so a name accepted in one place
is accepted everywhere, and a bad one gets the same message.

Example:
    >>> parse_dtype("bf16"), dtype_name(torch.float16)
    (torch.bfloat16, 'float16')
"""

from __future__ import annotations

import torch

from workbench.big_modeling.errors import BadInputError

AS_STORED = "as stored"
"""The label of "no dtype given": weights keep the checkpoint's dtype."""

DTYPE_CHOICES: tuple[str, ...] = ("bfloat16", "float16", "float32", "float8_e4m3fn")
"""The load dtypes the CLI and the GUI offer, in menu order (any other torch dtype also parses)."""

_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp64": "float64",
    "double": "float64",
    "fp8": "float8_e4m3fn",
}
_NO_DTYPE = frozenset(("", "auto", "none", AS_STORED))
_BY_NAME: dict[str, torch.dtype] = {
    str(value).removeprefix("torch."): value
    for value in vars(torch).values()
    if isinstance(value, torch.dtype)
}
_BY_NAME |= {alias: _BY_NAME[name] for alias, name in _ALIASES.items()}
_HINT = ", ".join(DTYPE_CHOICES) + " (aliases: bf16, fp16, half, fp32, float, fp8)"


def lookup_dtype(name: object) -> torch.dtype | None:
    """The dtype a name denotes (``"bfloat16"``, ``"torch.bf16"``, ``"FP16"``), else ``None``.

    For callers with their own error (a file format's reader); others use ``to_dtype``.

    Example:
        >>> lookup_dtype("half"), lookup_dtype("float99")
        (torch.float16, None)
    """
    if isinstance(name, torch.dtype):
        return name
    if not isinstance(name, str):
        return None
    return _BY_NAME.get(name.strip().lower().removeprefix("torch."))


def to_dtype(value: str | torch.dtype) -> torch.dtype:
    """Return the ``torch.dtype`` a name or dtype denotes.

    Raises:
        BadInputError: for a value that names no torch dtype; the message names it and lists
            the usual ones.

    Example:
        >>> to_dtype("torch.float16"), to_dtype(torch.bfloat16)
        (torch.float16, torch.bfloat16)
    """
    dtype = lookup_dtype(value)
    if dtype is None:
        raise BadInputError(f"dtype {value!r} is not a torch dtype; use one of {_HINT}")
    return dtype


def parse_dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    """Like ``to_dtype``, but "no dtype" (``None``, ``""``, ``"auto"``, ``"as stored"``) is ``None``.

    Raises:
        BadInputError: for a value that names no torch dtype.

    Example:
        >>> parse_dtype("bf16"), parse_dtype("auto")
        (torch.bfloat16, None)
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in _NO_DTYPE):
        return None
    return to_dtype(value)


def dtype_name(dtype: torch.dtype | None) -> str:
    """The canonical name of a dtype (``torch.bfloat16`` -> ``"bfloat16"``); ``None`` -> ``"as stored"``.

    ``to_dtype(dtype_name(d)) == d`` for every torch dtype; offload indexes store these names.
    """
    return AS_STORED if dtype is None else str(dtype).removeprefix("torch.")
