"""Where a model keeps fused MoE expert weights (torch only: planning reads it on meta models).

transformers 5 stores a MoE block's experts as one module with 3-D parameters ``[E, out, in]``
(Mixtral ``experts.gate_up_proj [E, 2I, H]`` and ``experts.down_proj [E, H, I]``); see
``experts`` for how they are quantized.
"""

from __future__ import annotations

import torch
from torch import nn

EXPERT_WEIGHT_NAMES = ("gate_up_proj", "up_proj", "gate_proj", "down_proj")
"""Attribute names of fused 3-D expert weights in transformers 5's experts modules."""


def fused_expert_weights(module: nn.Module) -> dict[str, nn.Parameter]:
    """``{attribute: parameter}`` of a module's fused ``[E, out, in]`` expert weights.

    A module qualifies when it has ``num_experts``, no expert biases, is not transposed
    (``is_transposed``, transformers' flag) and holds 3-D parameters of ``num_experts`` rows
    under ``EXPERT_WEIGHT_NAMES``. Works on meta modules.

    Example:
        >>> fused_expert_weights(nn.Linear(2, 2))
        {}
    """
    experts = getattr(module, "num_experts", None)
    if not isinstance(experts, int) or isinstance(module, nn.Linear):
        return {}
    if getattr(module, "is_transposed", False) or getattr(module, "has_bias", False):
        return {}
    found: dict[str, nn.Parameter] = {}
    for attr in EXPERT_WEIGHT_NAMES:
        param = module._parameters.get(attr)
        if param is not None and param.dim() == 3 and param.shape[0] == experts:
            found[attr] = param
    return found


def fused_expert_shapes(model: nn.Module) -> dict[str, tuple[int, int, int, torch.dtype]]:
    """``{tensor name: (experts, out, in, dtype)}`` of every fused expert weight of ``model``.

    Example:
        >>> fused_expert_shapes(nn.Sequential(nn.Linear(4, 2)))
        {}
    """
    shapes: dict[str, tuple[int, int, int, torch.dtype]] = {}
    for name, module in model.named_modules():
        for attr, param in fused_expert_weights(module).items():
            experts, rows, columns = (int(size) for size in param.shape)
            shapes[f"{name}.{attr}" if name else attr] = (experts, rows, columns, param.dtype)
    return shapes
