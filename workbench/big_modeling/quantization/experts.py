"""Fused MoE expert weights (transformers 5's 3-D ``[E, N, K]`` parameters), quantized on CPU.

In transformers 5 the experts of Mixtral, Qwen2-MoE and their kin are one module holding
``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]`` (``@use_experts_implementation``); they
are not ``nn.Linear``, so a Linear-only quantizer leaves most of a MoE model's bytes unquantized.
What torchao 0.18 can do with them on CPU (measured on a tiny Mixtral, bf16):

- ``int8``: ``Int8Tensor.from_hp`` takes a 3-D weight (per-row scales ``[E, N, 1]``), and its
  ``select``/``index`` give each expert's 2-D ``Int8Tensor``: the *eager* experts forward
  (``F.linear(x, gate_up_proj[e])``) runs, logits within 0.4 % of bf16. The default
  ``grouped_mm`` and ``batched_mm`` forwards fail (``aten.transpose`` / ``aten.bmm`` missing).
- ``fp8``: ``Float8Tensor.from_hp`` 3-D, runs eager and ``grouped_mm`` (0.8 %).
- ``int4-g*``: ``Int4OpaqueTensor`` (the CPU tinygemm layout) is 2-D only ("Expecting 2D tensor
  on CPU"), so ``Int4ExpertsTensor`` here stacks one per expert and indexes back to it.
- ``nf4``/``fp4``: ``bnb4.Bnb4bitTensor`` quantizes one expert at a time the same way.

So a quantized experts module is switched to the eager experts forward (``config.
_experts_implementation = "eager"``, shared by the model's experts). Only the un-transposed
layout ``[E, out, in]`` with no expert biases is handled; others are reported as skipped. The
bytes are exactly ``E`` times the 2-D weight's (``sizes.quantized_weight_nbytes``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import return_and_correct_aliasing
from torchao.prototype.quantization.int4 import Int4OpaqueTensor
from torchao.quantization import Float8Tensor, Int8Tensor, PerRow
from torchao.utils import TorchAOBaseTensor

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.quantization.bnb4 import Bnb4bitTensor, quantize_4bit
from workbench.big_modeling.quantization.expert_layout import (
    EXPERT_WEIGHT_NAMES,
    fused_expert_shapes,
    fused_expert_weights,
)
from workbench.big_modeling.quantization.precisions import Precision

__all__ = [
    "CPU_INT4_ROWS",
    "EXPERT_WEIGHT_NAMES",
    "Int4ExpertsTensor",
    "expert_weight",
    "experts_skip_reason",
    "fused_expert_shapes",
    "fused_expert_weights",
    "fused_experts_work",
    "quantize_experts",
    "use_eager_experts",
]

aten = torch.ops.aten


class Int4ExpertsTensor(TorchAOBaseTensor):
    """``E`` CPU int4 weights (``Int4OpaqueTensor`` layout) stacked; ``w[e]`` is expert ``e``'s.

    Inner tensors: ``qdata`` ``[E, N, K/2]`` uint8, ``scale_and_zero`` ``[E, K/G, N, 2]`` in the
    weight's dtype; attributes: ``block_size`` (``[1, G]``, per expert) and ``shape``.
    """

    tensor_data_names = ["qdata", "scale_and_zero"]
    tensor_attribute_names = ["block_size", "shape"]

    def __new__(
        cls, qdata: torch.Tensor, scale_and_zero: torch.Tensor, block_size: list[int], shape: Any
    ) -> Int4ExpertsTensor:
        kwargs = {"device": qdata.device, "dtype": scale_and_zero.dtype, "requires_grad": False}
        return torch.Tensor._make_wrapper_subclass(cls, torch.Size(shape), **kwargs)  # type: ignore[attr-defined]

    def __init__(
        self, qdata: torch.Tensor, scale_and_zero: torch.Tensor, block_size: list[int], shape: Any
    ) -> None:
        super().__init__()
        self.qdata = qdata
        self.scale_and_zero = scale_and_zero
        self.block_size = list(block_size)

    def expert(self, index: int) -> Int4OpaqueTensor:
        """Expert ``index``'s 2-D ``Int4OpaqueTensor``."""
        index = int(index)
        return Int4OpaqueTensor(
            self.qdata[index], self.scale_and_zero[index], self.block_size, self.shape[1:]
        )

    @classmethod
    def from_hp(cls, weight: torch.Tensor, group_size: int) -> Int4ExpertsTensor:
        """Quantize a CPU ``[E, N, K]`` weight, one expert at a time."""
        experts = [Int4OpaqueTensor.from_hp(w, [1, group_size]) for w in weight.unbind(0)]
        return cls(
            torch.stack([expert.qdata for expert in experts]),
            torch.stack([expert.scale_and_zero for expert in experts]),
            [1, group_size],
            weight.shape,
        )


@Int4ExpertsTensor.implements(aten.select.int)
def _select(func: Any, types: Any, args: Any, kwargs: Any) -> Int4OpaqueTensor:
    if args[1] != 0:
        raise BadInputError("fused int4 experts can only be indexed by expert (dim 0)")
    return return_and_correct_aliasing(func, args, kwargs, args[0].expert(args[2]))


@Int4ExpertsTensor.implements(aten.index.Tensor)
def _index(func: Any, types: Any, args: Any, kwargs: Any) -> Int4OpaqueTensor:
    indices = args[1]
    if len(indices) != 1 or indices[0] is None or indices[0].numel() != 1:
        raise BadInputError("fused int4 experts are indexed by one expert at a time")
    expert = args[0].expert(int(indices[0].reshape(())))
    return return_and_correct_aliasing(func, args, kwargs, expert)


def expert_weight(weight: torch.Tensor, index: int) -> torch.Tensor:
    """Expert ``index``'s 2-D weight of a quantized ``[E, N, K]`` weight.

    Built from the inner tensors without an ATen view op on the wrapper: under
    ``torch.inference_mode`` such a view fails ("Cannot set version_counter for inference
    tensor") for every torchao wrapper, which breaks the eager experts forward.
    """
    if isinstance(weight, (Int4ExpertsTensor, Bnb4bitTensor)):
        return weight.expert(index)
    cls = type(weight)
    select = cls._ATEN_OP_TABLE[cls][aten.select.int]  # type: ignore[attr-defined]
    return select(aten.select.int, (cls,), (weight, 0, int(index)), {})


def _is_expert_index(index: object) -> bool:
    if isinstance(index, int) and not isinstance(index, bool):
        return True
    return (
        isinstance(index, torch.Tensor)
        and index.dim() == 0
        and not index.is_floating_point()
        and index.dtype != torch.bool
    )


def _getitem(func: Any, types: Any, args: Any, kwargs: Any) -> torch.Tensor:
    weight, index = args[0], args[1]
    if weight.dim() == 3 and _is_expert_index(index):
        return expert_weight(weight, int(index))
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **(kwargs or {}))


for _cls in (Int8Tensor, Float8Tensor, Int4ExpertsTensor, Bnb4bitTensor):
    # ``implements_torch_function`` is torchao's extension point; this adds ``w[e]`` for 3-D
    # weights and leaves every other indexing to the class's own ops.
    _cls.implements_torch_function(torch.Tensor.__getitem__)(_getitem)  # type: ignore[attr-defined]


CPU_INT4_ROWS = 16
"""torchao's CPU int4 packing (``_convert_weight_to_int4pack_for_cpu``) needs N % 16 == 0."""


def experts_skip_reason(weight: torch.Tensor, precision: Precision) -> str | None:
    """Why a fused ``[E, N, K]`` weight stays as loaded at ``precision``; ``None`` if it won't."""
    if precision.kind == "int4" and weight.shape[-1] % (precision.group_size or 128):
        return (
            f"in_features {weight.shape[-1]} is not a multiple of the int4 group size "
            f"{precision.group_size}; kept as loaded"
        )
    if precision.kind == "int4" and weight.shape[-2] % CPU_INT4_ROWS:
        return (
            f"out_features {weight.shape[-2]} is not a multiple of {CPU_INT4_ROWS}, which "
            "torchao's CPU int4 packing needs; kept as loaded"
        )
    if weight.device.type not in ("cpu", "meta") and precision.kind == "int4":
        return (
            f"fused experts on {weight.device} at {precision.name}: the stacked int4 experts "
            "layout is CPU-only (Int4OpaqueTensor); kept as loaded"
        )
    return None


def fused_experts_work(
    name: str, module: nn.Module, precision: Precision
) -> tuple[list[tuple[str, nn.Module, str, Precision]], list[tuple[str, str]]]:
    """``quantize_model``'s work items and skips for a module's fused expert weights.

    Returns:
        ``([(parameter name, module, parameter name, precision)], [(parameter name, reason)])``;
        both empty for a module with no fused experts.
    """
    work: list[tuple[str, nn.Module, str, Precision]] = []
    skipped: list[tuple[str, str]] = []
    for attr, param in fused_expert_weights(module).items():
        weight_name = f"{name}.{attr}" if name else attr
        reason = experts_skip_reason(param, precision) if precision.quantized else None
        if reason is not None:
            skipped.append((weight_name, reason))
        else:
            work.append((weight_name, module, weight_name, precision))
    return work, skipped


def quantize_experts(weight: torch.Tensor, precision: Precision) -> torch.Tensor:
    """The quantized copy of a CPU ``[E, N, K]`` expert weight.

    Raises:
        BadInputError: a plain dtype (cast instead) or no bitsandbytes for nf4/fp4.
    """
    weight = weight.detach()
    if precision.kind == "int8":
        return Int8Tensor.from_hp(weight, granularity=PerRow())
    if precision.kind == "fp8":
        return Float8Tensor.from_hp(weight, float8_dtype=torch.float8_e4m3fn, granularity=PerRow())
    if precision.kind == "int4":
        return Int4ExpertsTensor.from_hp(weight, precision.group_size or 128)
    if precision.kind in ("nf4", "fp4"):
        return quantize_4bit(weight, precision)
    raise BadInputError(f"quantize_experts quantizes, {precision.name} is a plain dtype")


def use_eager_experts(module: nn.Module) -> None:
    """Switch an experts module (and its model, which shares the config) to the eager forward.

    The eager forward indexes each weight by expert and calls ``F.linear``, which every
    quantized tensor here implements; the batched/grouped ones need ops torchao lacks.
    """
    config = getattr(module, "config", None)
    if config is not None and hasattr(config, "_experts_implementation"):
        config._experts_implementation = "eager"
