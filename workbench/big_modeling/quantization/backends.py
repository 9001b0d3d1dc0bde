"""Which library quantizes a weight, chosen by its precision and the device it lives on.

========  ============================================  ==========================================
kind      cpu                                           cuda
========  ============================================  ==========================================
int8      ``Int8WeightOnlyConfig`` (``Int8Tensor``;      the same (runs on any CUDA GPU)
          its CPU matmul: ``int8_cpu``)
int4-gG   ``PrototypeInt4WeightOnlyConfig``              ``Int4WeightOnlyConfig(group_size=G)``:
          (``Int4OpaqueTensor``, CPU tinygemm)          the default ``plain`` layout where mslk is
                                                        installed, else ``tile_packed_to_4d``
                                                        (PyTorch's tinygemm); bfloat16, sm80+
fp8       ``Float8WeightOnlyConfig`` (``Float8Tensor``)  the same, sm89+ (Ada, Hopper and newer)
nf4/fp4   bitsandbytes (``bnb4.Bnb4bitTensor``)         bitsandbytes (its CUDA kernels)
========  ============================================  ==========================================

Modules on the cpu or disk tier of a map that has a GPU run on the GPU (the weights move per
forward), so their precision must run there too (``check_offloaded``): the CPU int4 layout is
refused for them. Any other device (``mps``, ``xpu``) or combination is refused with ``BadInputError`` naming the
module, the device and the precision. The CUDA column is written to torchao 0.18's documented
layouts; it was not run on a GPU in this project's CI (its tests skip without CUDA).

Example:
    >>> type(torchao_config("int4-g64", "cpu")).__name__
    'PrototypeInt4WeightOnlyConfig'
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torchao.core.config import AOBaseConfig
from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
from torchao.quantization import (
    Float8WeightOnlyConfig,
    Int4WeightOnlyConfig,
    Int8WeightOnlyConfig,
    quantize_,
)
from torchao.quantization.quantize_.workflows.int4.int4_packing_format import Int4PackingFormat

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.quantization.int8_cpu import install as install_int8_cpu
from workbench.big_modeling.quantization.precisions import Precision, parse_precision

# int8 weights made here run on the CPU through one reused buffer (``int8_cpu``)
install_int8_cpu()

TORCHAO_KINDS = ("int8", "int4", "fp8")
"""Precision kinds torchao quantizes; ``nf4``/``fp4`` go to bitsandbytes."""


def _device(device: str | torch.device) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device(device)


def check_device(
    name: str, device: str | torch.device, precision: Precision | str, dtype: torch.dtype
) -> None:
    """Refuse a quantized precision that cannot run for a weight on ``device``.

    Args:
        name: the module, for the message.
        device: where the weight lives (and runs).
        precision: the precision to apply.
        dtype: the weight's dtype before quantization.

    Raises:
        BadInputError: naming module, device and precision, with what would work instead.
    """
    precision = parse_precision(precision)
    device = _device(device)
    if not precision.quantized or device.type in ("cpu", "meta"):
        return
    where = f"{name}: {precision.name} on {device}"
    if device.type != "cuda":
        raise BadInputError(
            f"{where}: quantized loads run on cpu, disk or CUDA devices here; map the module to "
            "cpu or disk, or keep it in a plain dtype."
        )
    if not torch.cuda.is_available():
        raise BadInputError(f"{where}: CUDA is not available in this process.")
    capability = torch.cuda.get_device_capability(device)
    if precision.kind == "fp8" and capability < (8, 9):
        raise BadInputError(
            f"{where}: float8 weights need compute capability 8.9+ (this GPU is "
            f"{capability[0]}.{capability[1]}); use int8 or int4 there."
        )
    if precision.kind == "int4":
        if capability < (8, 0):
            raise BadInputError(
                f"{where}: int4 CUDA kernels need compute capability 8.0+ (this GPU is "
                f"{capability[0]}.{capability[1]}); use int8 there."
            )
        if dtype != torch.bfloat16:
            raise BadInputError(
                f"{where}: torchao's CUDA int4 layouts take bfloat16 weights, this one is "
                f"{dtype}; load the model in bfloat16 or use int8 there."
            )


def offload_execution_device(model: nn.Module) -> torch.device | None:
    """Where cpu and disk modules will run once dispatched: the first accelerator holding a
    parameter (``dispatch_model``'s main device: the first accelerator of the map), else None.
    """
    for parameter in model.parameters():
        if parameter.device.type not in ("cpu", "meta"):
            return parameter.device
    return None


def check_offloaded(
    name: str, device: torch.device, precision: Precision | str, dtype: torch.dtype
) -> None:
    """Refuse a cpu/disk-tier precision whose weight cannot run on the main ``device``.

    Dispatch runs cpu and disk modules on the main accelerator, moving their (quantized)
    weights there per forward. The CPU int4 layout (``Int4OpaqueTensor``) has only CPU kernels;
    int8, fp8 and nf4/fp4 tensors move and run as they are (fp8 needs sm89+ there).

    Raises:
        BadInputError: naming the module, the device and the precision.
    """
    precision = parse_precision(precision)
    if precision.kind == "int4":
        raise BadInputError(
            f"{name}: {precision.name} on the cpu/disk tier runs on {device} (the main device) "
            "once dispatched, and torchao's CPU int4 layout has no kernels there; use int8 or "
            "nf4 for offloaded modules, or map this one to the GPU."
        )
    check_device(name, device, precision, dtype)


def torchao_config(precision: Precision | str, device: str | torch.device = "cpu") -> AOBaseConfig:
    """The torchao weight-only config for a precision on a device (table in the module docs).

    Raises:
        BadInputError: a plain dtype or nf4/fp4 (not torchao formats here).

    Example:
        >>> type(torchao_config("int8", "cuda")).__name__
        'Int8WeightOnlyConfig'
    """
    precision = parse_precision(precision)
    device = _device(device)
    # set_inductor_config=False: do not change torch._inductor globals for the whole process
    if precision.kind == "int8":
        return Int8WeightOnlyConfig(set_inductor_config=False)
    if precision.kind == "fp8":
        return Float8WeightOnlyConfig(set_inductor_config=False)
    if precision.kind == "int4":
        group = precision.group_size or 128
        if device.type == "cuda":
            return Int4WeightOnlyConfig(
                group_size=group, int4_packing_format=_cuda_int4_format(), set_inductor_config=False
            )
        return PrototypeInt4WeightOnlyConfig(group_size=group, set_inductor_config=False)
    raise BadInputError(
        f"{precision.name} is not a torchao format here (nf4/fp4 use bitsandbytes, "
        "plain dtypes are cast)"
    )


def _cuda_int4_format() -> Int4PackingFormat:
    from torchao.utils import _is_mslk_available  # noqa: PLC0415 (private: may move)

    if _is_mslk_available():
        return Int4PackingFormat.PLAIN
    return Int4PackingFormat.TILE_PACKED_TO_4D


def quantize_weight(weight: torch.Tensor, precision: Precision | str) -> torch.Tensor:
    """A quantized copy of a 2-D ``nn.Linear`` weight, on the weight's device.

    Args:
        weight: a real (cpu or cuda) floating weight ``[out, in]``.
        precision: a quantized precision.

    Returns:
        A torchao tensor or a ``bnb4.Bnb4bitTensor`` reporting the weight's shape and dtype.

    Raises:
        BadInputError: a plain dtype, no bitsandbytes for nf4/fp4, or torchao left it as it was.
    """
    precision = parse_precision(precision)
    if precision.kind in ("nf4", "fp4"):
        from workbench.big_modeling.quantization.bnb4 import quantize_4bit  # noqa: PLC0415

        return quantize_4bit(weight, precision)
    config = torchao_config(precision, weight.device)
    holder = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    holder.weight = nn.Parameter(weight.detach(), requires_grad=False)
    quantize_(holder, config)
    if type(holder.weight) in (nn.Parameter, torch.Tensor):
        raise BadInputError(
            f"torchao left a {list(weight.shape)} weight unquantized under {type(config).__name__}"
        )
    return holder.weight


WARM_UP_SIDE = 128
"""Side of the square weight ``warm_up_quantization`` quantizes (int4-g128's group size)."""


def warm_up_quantization(precisions: Iterable[Precision | str], dtype: torch.dtype) -> list[str]:
    """Quantize one small CPU weight to each precision and run a matmul through it, so that the
    libraries' first-call set-up (lazily built kernels, lookup tables, dispatch caches) is done
    before a load measures what its weights take: on this project's CPU about 0.14 MiB for the
    first quantization of a kind and as much for its first matmul, which a 2M-parameter demo's
    load and run would otherwise count as weights and activations (issue 21).

    Args:
        precisions: the precisions a load will quantize to (plain dtypes are skipped).
        dtype: the compute dtype of the weights (int4, whose CPU kernel takes bfloat16 only,
            is warmed in bfloat16).

    Returns:
        The precisions that could not be warmed (the load itself reports why).
    """
    failed = []
    with torch.inference_mode():
        for precision in precisions:
            try:
                parsed = parse_precision(precision)
                if parsed.kind == "dtype":
                    continue
                compute = torch.bfloat16 if parsed.kind == "int4" else dtype
                weight = torch.full((WARM_UP_SIDE, WARM_UP_SIDE), 0.01, dtype=compute)
                quantized = quantize_weight(weight, parsed)
                torch.nn.functional.linear(torch.ones(1, WARM_UP_SIDE, dtype=compute), quantized)
            except (BadInputError, RuntimeError, ValueError, TypeError):
                failed.append(str(precision))
    return failed
