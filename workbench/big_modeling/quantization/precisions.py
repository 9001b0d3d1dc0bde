"""The one precision vocabulary: how a module's weights are stored after loading.

A *precision* is either a plain torch dtype (``bfloat16``, ``float16``, ``float32``: the weight is
cast) or a weight-only quantization format. Quantized formats pack the weight of ``nn.Linear``
layers and keep a scale (and for int4 a zero point) per channel, group or block; the rest of the
module (biases, norms) keeps its dtype. The CLI, the GUI, the planner, the loader and the exported
``quantization_config`` all read names through ``parse_precision``, so a name accepted in one place
is accepted everywhere.

Names (aliases in brackets):

- ``int8``: int8 weight-only, one scale per output channel.
- ``int4-g32`` / ``int4-g64`` / ``int4-g128`` (``int4`` = ``int4-g128``): int4 weight-only,
  asymmetric, one scale and one zero point per group of that many input features.
- ``nf4`` / ``fp4``: 4-bit NormalFloat / FP4 in blocks of 64 with an absmax per block;
  ``nf4-dq`` / ``fp4-dq`` add double quantisation of the absmax (about 0.127 bits/param extra
  instead of 0.5).
- ``fp8`` (``fp8-e4m3``): float8 e4m3 weights, one scale per output channel.
- ``bfloat16`` / ``float16`` / ``float32`` (and the aliases ``dtypes`` accepts): the weight cast.

A *precision map* is ``{module name: precision name}`` with the same covering rule as a device
map: the longest prefix names the precision of a module; ``""`` covers the whole model.

Example:
    >>> parse_precision("int4").name, parse_precision("NF4-DQ").double_quant
    ('int4-g128', True)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from workbench.big_modeling.dtypes import DTYPE_CHOICES, dtype_name, lookup_dtype
from workbench.big_modeling.errors import BadInputError


@dataclass(frozen=True)
class Precision:
    """One precision: a cast to ``dtype`` (``kind == "dtype"``) or a weight-only format.

    Attributes:
        name: the canonical name (``"int4-g64"``, ``"bfloat16"``).
        kind: ``"dtype"``, ``"int8"``, ``"int4"``, ``"nf4"``, ``"fp4"`` or ``"fp8"``.
        weight_bits: bits per weight element before scales (16 for bfloat16, 4 for int4).
        group_size: input features per scale for ``int4`` (32/64/128), the block size (64) for
            ``nf4``/``fp4``, ``None`` for per-channel or plain dtypes.
        double_quant: ``nf4``/``fp4`` only: the absmax of each block is itself quantized.
        dtype: the torch dtype for ``kind == "dtype"``; ``None`` for quantized formats.
    """

    name: str
    kind: str
    weight_bits: int
    group_size: int | None = None
    double_quant: bool = False
    dtype: torch.dtype | None = None

    @property
    def quantized(self) -> bool:
        """Whether this is a weight-only quantization format rather than a plain dtype."""
        return self.kind != "dtype"


QUANTIZED_CHOICES: tuple[str, ...] = (
    "int8",
    "int4-g32",
    "int4-g64",
    "int4-g128",
    "nf4",
    "nf4-dq",
    "fp4",
    "fp4-dq",
    "fp8",
)
"""The quantized precisions the CLI and the GUI offer, in menu order."""

PRECISION_CHOICES: tuple[str, ...] = QUANTIZED_CHOICES + tuple(
    name for name in DTYPE_CHOICES if name != "float8_e4m3fn"
)
"""Every precision offered: the quantized formats, then the model dtypes."""

_ALIASES = {"int4": "int4-g128", "fp8-e4m3": "fp8", "float8": "fp8", "float8_e4m3fn": "fp8"}


def _quantized(name: str) -> Precision:
    if name == "int8":
        return Precision(name, "int8", 8)
    if name.startswith("int4-g"):
        return Precision(name, "int4", 4, group_size=int(name.removeprefix("int4-g")))
    if name == "fp8":
        return Precision(name, "fp8", 8)
    kind = name[:3]
    return Precision(name, kind, 4, group_size=64, double_quant=name.endswith("-dq"))


def parse_precision(name: object) -> Precision:
    """The precision a name denotes; raises ``BadInputError`` naming the choices otherwise.

    Args:
        name: a precision name or alias (case-insensitive), a torch dtype, or a ``Precision``.

    Returns:
        The ``Precision``.

    Raises:
        BadInputError: the name is not a precision.

    Example:
        >>> parse_precision("bf16")
        Precision(name='bfloat16', kind='dtype', weight_bits=16, group_size=None, double_quant=False, dtype=torch.bfloat16)
    """
    if isinstance(name, Precision):
        return name
    if isinstance(name, str):
        return _parse_name(name)
    return _parse_other(name)


@functools.lru_cache(maxsize=256)
def _parse_name(name: str) -> Precision:
    """``parse_precision`` of a string, cached: planners parse the same few names per tensor."""
    key = name.strip().lower().removeprefix("torch.")
    key = _ALIASES.get(key, key)
    if key in QUANTIZED_CHOICES:
        return _quantized(key)
    return _parse_other(name)


def _parse_other(name: object) -> Precision:
    dtype = lookup_dtype(name)
    if dtype is not None and dtype.is_floating_point and dtype.itemsize >= 2:
        return Precision(dtype_name(dtype), "dtype", dtype.itemsize * 8, dtype=dtype)
    raise BadInputError(
        f"unknown precision {name!r}; expected one of {', '.join(PRECISION_CHOICES)} "
        "(aliases: int4 = int4-g128, fp8-e4m3, bf16, fp16, fp32)"
    )


def parse_precisions(text: str) -> tuple[Precision, ...]:
    """A comma-separated list of precisions (the CLI's ``--precisions int4,int8,bf16``).

    Example:
        >>> [p.name for p in parse_precisions("int4, int8,bf16")]
        ['int4-g128', 'int8', 'bfloat16']
    """
    names = [part for part in (piece.strip() for piece in text.split(",")) if part]
    if not names:
        raise BadInputError(
            "no precision given; expected a comma-separated list such as int4,int8,bf16"
        )
    return tuple(dict.fromkeys(parse_precision(part) for part in names))
