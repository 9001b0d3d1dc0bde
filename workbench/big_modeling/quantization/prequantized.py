"""Checkpoints stored already quantized (GPTQ, AWQ, compressed-tensors, bitsandbytes): planned
from their safetensors headers at the bytes they store, with their ``quantization_config``.

The empty model transformers builds from such a ``config.json`` has plain ``Linear.weight``
tensors, while the files hold the packed parts under other names. Each stored tensor is given to
the module it sits under (the longest module-name prefix), and every part the model does not
have is counted into that module's ``weight``:

====================  ==================================================================
method                stored per quantized Linear ``X`` (all counted into ``X.weight``)
====================  ==================================================================
``gptq``              ``X.qweight`` int32 (K*b/32, N), ``X.qzeros``, ``X.scales``, ``X.g_idx``
``awq``               ``X.qweight`` int32 (K, N*b/32), ``X.qzeros``, ``X.scales``
``compressed-tensors``  ``X.weight_packed`` int32 (N, K*b/32), ``X.weight_scale``,
                      ``X.weight_zero_point``, ``X.weight_shape`` (or fp8 ``X.weight`` +
                      ``X.weight_scale``)
``bitsandbytes``      4-bit: ``X.weight`` uint8 + ``X.weight.absmax``, ``.quant_map``,
                      ``.nested_absmax``, ``.nested_quant_map``, ``.quant_state.*``;
                      8-bit: ``X.weight`` int8 + ``X.SCB``, ``X.weight_format``
====================  ==================================================================

so no per-format table of sizes is needed: the header's bytes are exact by construction.

Example:
    >>> config = read_quantization_config({"quantization_config": {
    ...     "quant_method": "gptq", "bits": 4, "group_size": 128}})
    >>> config.method, config.bits, config.summary()
    ('gptq', 4, 'gptq 4-bit, group 128')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from workbench.big_modeling.errors import BadInputError

METHODS = ("gptq", "awq", "compressed-tensors", "bitsandbytes", "fbgemm_fp8", "fp8", "torchao")
"""The ``quant_method`` values planned from headers."""


@dataclass(frozen=True)
class PrequantizedConfig:
    """What a checkpoint's ``quantization_config`` says, in the fields users compare.

    Attributes:
        method: ``quant_method`` (``"gptq"``, ``"awq"``, ``"compressed-tensors"``, ...).
        bits: weight bits (4, 8), ``None`` when the config does not say.
        group_size: input features per scale, ``None`` for per-channel or unknown.
        not_converted: modules the config leaves unquantized (``modules_to_not_convert``,
            ``ignore``, ``llm_int8_skip_modules``).
        raw: the ``quantization_config`` as read, for display.
    """

    method: str
    bits: int | None = None
    group_size: int | None = None
    not_converted: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        """``"gptq 4-bit, group 128"``."""
        parts = [self.method]
        if self.bits is not None:
            parts[0] += f" {self.bits}-bit"
        if self.group_size is not None and self.group_size > 0:
            parts.append(f"group {self.group_size}")
        return ", ".join(parts)


def read_quantization_config(
    config: Mapping[str, Any], where: str = "config.json"
) -> PrequantizedConfig | None:
    """The ``quantization_config`` of a ``config.json`` dict, or ``None`` when it has none.

    Raises:
        BadInputError: a ``quantization_config`` that is not an object or names no
            ``quant_method``, or a method this planner does not size (naming the choices).
    """
    raw = config.get("quantization_config")
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("quant_method"), str):
        raise BadInputError(
            f"{where}: quantization_config must be an object with a 'quant_method' string, "
            f"got {type(raw).__name__}"
        )
    method = raw["quant_method"].lower()
    if method not in METHODS:
        raise BadInputError(
            f"{where}: quantization_config.quant_method {raw['quant_method']!r} is not one "
            f"this planner sizes; expected one of {', '.join(METHODS)}"
        )
    bits, group = _bits_and_group(method, raw)
    skipped = (
        raw.get("modules_to_not_convert") or raw.get("ignore") or raw.get("llm_int8_skip_modules")
    )
    return PrequantizedConfig(
        method=method,
        bits=bits,
        group_size=group,
        not_converted=tuple(str(name) for name in skipped or ()),
        raw=dict(raw),
    )


def _bits_and_group(method: str, raw: Mapping[str, Any]) -> tuple[int | None, int | None]:
    if method == "compressed-tensors":
        for group in (raw.get("config_groups") or {}).values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping):
                return _int(weights.get("num_bits")), _int(weights.get("group_size"))
        return None, None
    if method == "bitsandbytes":
        return (4 if raw.get("load_in_4bit") else 8 if raw.get("load_in_8bit") else None), 64
    if method in ("fbgemm_fp8", "fp8"):
        return 8, None
    return _int(raw.get("bits", raw.get("w_bit"))), _int(
        raw.get("group_size", raw.get("q_group_size"))
    )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def stored_tensor_nbytes(
    stored_nbytes: Mapping[str, int], model: nn.Module
) -> tuple[dict[str, int], list[str]]:
    """The bytes each of the model's tensors takes in a pre-quantized checkpoint.

    Args:
        stored_nbytes: bytes per tensor name as the checkpoint headers give them.
        model: the (meta) model transformers builds from the config.

    Returns:
        ``({model tensor: bytes}, orphans)``: packed parts counted into their module's
        ``weight``; ``orphans`` are stored tensors under no module with a weight, sorted.

    Example:
        >>> model = nn.Sequential(nn.Linear(64, 32))
        >>> stored_tensor_nbytes({"0.qweight": 1024, "0.scales": 64, "0.bias": 64}, model)
        ({'0.weight': 1088, '0.bias': 64}, [])
    """
    own = dict(model.state_dict(keep_vars=True))
    modules = dict(model.named_modules())
    sizes: dict[str, int] = {}
    orphans: list[str] = []
    for name, nbytes in stored_nbytes.items():
        if name in own:
            sizes[name] = sizes.get(name, 0) + int(nbytes)
            continue
        owner = name.rpartition(".")[0]
        while owner and (owner not in modules or f"{owner}.weight" not in own):
            owner = owner.rpartition(".")[0]
        if not owner:
            orphans.append(name)
            continue
        key = f"{owner}.weight"
        sizes[key] = sizes.get(key, 0) + int(nbytes)
    return sizes, sorted(orphans)
