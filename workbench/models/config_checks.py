"""Structural fields of a model config, checked before anything is built.

transformers builds what a config says: ``hidden_size: 0`` opens as a 0-parameter model,
``num_hidden_layers: -3`` as ``range(-3)`` (no layers), and ``num_hidden_layers: 10**12``
builds layers until memory runs out. ``check_config_structure`` refuses each with the field,
the value and, for sizes, the estimate that is over the limit.

Example:
    >>> from transformers import LlamaConfig
    >>> check_config_structure(LlamaConfig(num_hidden_layers=-3), "config.json")
    Traceback (most recent call last):
    ...
    workbench.models.errors.ModelSourceError: config.json: 'num_hidden_layers' must be a whole number of at least 1, got -3
"""

from __future__ import annotations

from typing import Any

from workbench.models.errors import ModelSourceError

__all__ = ["MAX_ESTIMATED_MODULES", "MAX_ESTIMATED_PARAMS", "check_config_structure"]

# Fields that must be whole numbers of at least 1 when the config has them.
POSITIVE_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "vocab_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "moe_intermediate_size",
)
# Expert counts may be 0 (a dense model of a MoE family) but never negative.
COUNT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok")
# DeepSeek-V3 (61 layers x 256 experts x 3 projections) has ~48,000 modules; Llama 3.1 405B
# has ~1,300. 2 million is far above any real model and far below what exhausts memory.
MAX_ESTIMATED_MODULES = 2_000_000
MAX_ESTIMATED_PARAMS = 10**15  # 1,000x the largest published models
_MODULES_PER_LAYER = 16  # attention (q, k, v, o, rotary), MLP (gate, up, down, act), 2 norms...
_MODULES_PER_EXPERT = 4  # gate, up, down, act


def check_config_structure(config: Any, source: object) -> None:
    """Refuse a config whose structural fields cannot describe a buildable model.

    Checks the config and its ``text_config`` (vision-language models keep sizes there).

    Raises:
        ModelSourceError: naming ``source``, the field and the value (a non-integer, zero or
            negative size or layer count), or the module or parameter estimate above
            ``MAX_ESTIMATED_MODULES`` / ``MAX_ESTIMATED_PARAMS`` with the fields behind it.
    """
    for part, prefix in ((config, ""), (getattr(config, "text_config", None), "text_config.")):
        if part is None:
            continue
        for name in POSITIVE_FIELDS:
            _check_whole(part, name, prefix, source, lowest=1)
        for name in COUNT_FIELDS:
            _check_whole(part, name, prefix, source, lowest=0)
        _check_estimates(part, prefix, source)


def _is_whole(value: Any, lowest: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= lowest


def _check_whole(part: Any, name: str, prefix: str, source: object, *, lowest: int) -> None:
    value = getattr(part, name, None)
    if value is None:
        return
    values = value if isinstance(value, list | tuple) and value else [value]  # per-layer lists
    if not all(_is_whole(item, lowest) for item in values):
        raise ModelSourceError(
            f"{source}: '{prefix}{name}' must be a whole number of at least {lowest}, got {value!r}"
        )


def _whole(part: Any, name: str, default: int) -> int:
    value = getattr(part, name, None)
    if isinstance(value, list | tuple) and value and all(_is_whole(v, 0) for v in value):
        return max(value)
    return value if _is_whole(value, 0) else default


def _check_estimates(part: Any, prefix: str, source: object) -> None:
    layers = _whole(part, "num_hidden_layers", 1)
    experts = max(
        _whole(part, "num_local_experts", 0),
        _whole(part, "num_experts", 0),
        _whole(part, "n_routed_experts", 0),
    )
    modules = layers * (_MODULES_PER_LAYER + _MODULES_PER_EXPERT * experts) + 8
    if modules > MAX_ESTIMATED_MODULES:
        raise ModelSourceError(
            f"{source}: would build about {modules:,} modules ({prefix}num_hidden_layers="
            f"{layers:,}, {experts:,} experts per layer), above the limit of "
            f"{MAX_ESTIMATED_MODULES:,}; check '{prefix}num_hidden_layers' and the expert counts"
        )
    hidden = _whole(part, "hidden_size", 1)
    inner = max(
        _whole(part, "intermediate_size", 4 * hidden), _whole(part, "moe_intermediate_size", 0)
    )
    vocab = _whole(part, "vocab_size", 1)
    per_layer = 4 * hidden * hidden + 3 * hidden * inner * max(experts, 1)
    params = layers * per_layer + 2 * vocab * hidden
    if params > MAX_ESTIMATED_PARAMS:
        raise ModelSourceError(
            f"{source}: would hold about {params:.3g} parameters ({prefix}hidden_size={hidden:,}, "
            f"{prefix}num_hidden_layers={layers:,}, {prefix}vocab_size={vocab:,}), above the "
            f"limit of {MAX_ESTIMATED_PARAMS:.0e}; check those fields"
        )
