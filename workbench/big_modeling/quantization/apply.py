"""Quantize a loaded model's ``nn.Linear`` weights (and fused MoE experts) per a precision map.

Which library and why (measured on this project's CPU machine, torch 2.13 CPU, torchao 0.18,
bitsandbytes 0.50; the choice per device is ``backends``'):

- ``int8``: ``Int8WeightOnlyConfig`` -> ``Int8Tensor`` (int8 per output channel + fp32 scale);
  runs on CPU (``bfloat16[1024, 1024]`` decode matmul 0.6x the bf16 time) and CUDA.
- ``int4-g*``: on CPU torchao's CPU int4 layout, ``PrototypeInt4WeightOnlyConfig`` ->
  ``Int4OpaqueTensor`` (two int4 per byte, tinygemm CPU kernel ``_weight_int4pack_mm_for_cpu``,
  bf16 scale+zero per group). The stable ``Int4WeightOnlyConfig`` layouts all fail on CPU in 0.18
  (``plain`` needs mslk, ``plain_int32`` refuses cpu, ``tile_packed_to_4d`` needs CUDA), and
  ``IntxWeightOnlyConfig(int4)`` keeps one int4 per *byte*, so it would not save the memory the
  plan promises. On CUDA: ``Int4WeightOnlyConfig`` (``backends``).
- ``fp8``: ``Float8WeightOnlyConfig`` -> ``Float8Tensor`` (e4m3 + fp32 scale per row).
- ``nf4``/``fp4`` (``-dq``): bitsandbytes' ``quantize_4bit`` -> ``bnb4.Bnb4bitTensor`` (chosen
  over torchao's ``NF4Tensor`` by measurement, see ``bnb4``); needs bitsandbytes installed.
- plain dtypes: the weight (and bias) are cast.
- fused MoE experts (3-D ``[E, N, K]``, ``experts``): the same formats, one expert at a time
  where torchao has no 3-D layout; the experts then run transformers' eager forward.

Tiers: a module whose weight is a real tensor (cpu) is quantized in place. A module whose weight
is on ``meta`` with an entry in the offload folder (``"disk"`` in the device map) is read from the
folder one module at a time, quantized on the CPU, and its packed inner tensors are written ONCE
to ``<weight>.quantized-<id>.safetensors`` in the folder; the index entry of the weight becomes a
``"torchao"`` record naming those tensors, and ``OffloadedWeightsLoader`` rebuilds the torchao
weight lazily each time a hook brings the module in (see ``packed.read_packed_entry``). The model
keeps a ``meta`` placeholder. Weights mapped to a CUDA device are quantized there with torchao's
CUDA layouts (or bitsandbytes'); cpu and disk modules of a map with a GPU run on that GPU, so
their precision must run there (``backends.check_offloaded``).

Example:
    >>> report = quantize_model(model, {"": "bfloat16", "layers.0": "int8"})  # doctest: +SKIP
    >>> report.nbytes_by_tier()  # doctest: +SKIP
    {'cpu': 1310720}
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torchao.core.config import AOBaseConfig

from workbench.big_modeling.device_map.coverage import tied_parameter_groups
from workbench.big_modeling.device_map.value import device_for
from workbench.big_modeling.dtypes import dtype_name
from workbench.big_modeling.errors import BadInputError, CheckpointError
from workbench.big_modeling.progress import CancelToken, LoadProgress, ProgressCallback
from workbench.big_modeling.quantization.backends import (
    check_device,
    check_offloaded,
    offload_execution_device,
    quantize_weight,
)
from workbench.big_modeling.quantization.backends import torchao_config as backend_config
from workbench.big_modeling.quantization.disk_writer import DiskWriter
from workbench.big_modeling.quantization.experts import (
    CPU_INT4_ROWS,
    fused_experts_work,
    quantize_experts,
    use_eager_experts,
)
from workbench.big_modeling.quantization.keep_high_precision import default_keep_high_precision
from workbench.big_modeling.quantization.packed import stored_nbytes
from workbench.big_modeling.quantization.precisions import Precision, parse_precision

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QuantizedModule:
    """One ``nn.Linear`` (or fused experts weight) after ``quantize_model``.

    Attributes:
        name: the module name (``"model.layers.3.mlp.up_proj"``); for fused experts the
            parameter's (``"model.layers.3.mlp.experts.gate_up_proj"``).
        precision: the canonical precision name applied (``"int4-g64"``, ``"bfloat16"``).
        tier: ``"cpu"`` or a CUDA device (``"cuda:0"``): quantized in place; ``"disk"``: packed
            tensors in the offload folder.
        weight_nbytes: bytes the weight now takes (packed data + scales + zero points).
        original_nbytes: bytes the weight took before.
    """

    name: str
    precision: str
    tier: str
    weight_nbytes: int
    original_nbytes: int


@dataclass(frozen=True)
class QuantizeReport:
    """What ``quantize_model`` did.

    Attributes:
        modules: each ``nn.Linear`` the map covered, in model order.
        skipped: ``(module name, reason)`` for covered modules left as they were (a tied weight,
            an input width the group size does not divide).
        packed_files: the safetensors files written to the offload folder.
    """

    modules: tuple[QuantizedModule, ...]
    skipped: tuple[tuple[str, str], ...]
    packed_files: tuple[Path, ...]

    def nbytes_by_tier(self) -> dict[str, int]:
        """Weight bytes of the covered modules per tier (``{"cpu": ..., "disk": ...}``)."""
        totals: dict[str, int] = {}
        for module in self.modules:
            totals[module.tier] = totals.get(module.tier, 0) + module.weight_nbytes
        return totals

    def nbytes_by_precision(self) -> dict[tuple[str, str], int]:
        """Weight bytes per ``(tier, precision)``."""
        totals: dict[tuple[str, str], int] = {}
        for module in self.modules:
            key = (module.tier, module.precision)
            totals[key] = totals.get(key, 0) + module.weight_nbytes
        return totals


def torchao_config(
    precision: Precision | str, device: str | torch.device = "cpu"
) -> AOBaseConfig | None:
    """The torchao weight-only config for a precision on a device; ``None`` for a plain dtype.

    ``nf4``/``fp4`` are bitsandbytes formats (``quantization.bnb4``): ``BadInputError``. The
    choice per device is ``quantization.backends``'s.

    Example:
        >>> type(torchao_config("int8")).__name__
        'Int8WeightOnlyConfig'
    """
    precision = parse_precision(precision)
    return backend_config(precision, device) if precision.quantized else None


def resolve_precision_map(
    model: nn.Module,
    precision_map: Mapping[str, Any] | None = None,
    quantize: str | None = None,
) -> dict[str, str]:
    """The precision map a load applies: an explicit map, or ``quantize`` with the defaults.

    ``quantize="int8"`` gives ``{"": "int8"}`` plus each module of
    ``default_keep_high_precision(model)`` (``lm_head``, tied weights, MoE routers) at its own
    dtype, which leaves it as loaded, as transformers' quantizers do.

    Raises:
        BadInputError: both or an unknown precision given.

    Example:
        >>> resolve_precision_map(model, quantize="int4")  # doctest: +SKIP
        {'': 'int4-g128', 'lm_head': 'bfloat16'}
    """
    if precision_map and quantize:
        raise BadInputError("give a precision map or a quantize precision, not both")
    if precision_map:
        return {str(key): parse_precision(value).name for key, value in precision_map.items()}
    if not quantize:
        return {}
    resolved = {"": parse_precision(quantize).name}
    modules = dict(model.named_modules())
    for name in default_keep_high_precision(model):
        resolved[name] = dtype_name(modules[name].weight.dtype)
    return resolved


def _tied_weights(model: nn.Module) -> set[str]:
    return {name for group in tied_parameter_groups(model) if len(group) > 1 for name in group}


def _check_offloaded_work(
    model: nn.Module, work: list[tuple[str, nn.Module, str, Precision]]
) -> None:
    """Refuse, before changing anything, cpu/disk precisions that cannot run on the GPU."""
    main = offload_execution_device(model)
    if main is None:
        return
    for name, module, weight_name, precision in work:
        weight = getattr(module, weight_name.rpartition(".")[2])
        if precision.quantized and weight.device.type in ("cpu", "meta"):
            check_offloaded(name, main, precision, weight.dtype)


def _weight_nbytes(module: nn.Module, weight_name: str) -> int:
    weight = getattr(module, weight_name.rpartition(".")[2])
    return weight.numel() * weight.element_size()


def _skip_reason(module: nn.Linear, precision: Precision) -> str | None:
    if precision.kind == "int4" and module.in_features % (precision.group_size or 128):
        return (
            f"in_features {module.in_features} is not a multiple of the int4 group size "
            f"{precision.group_size}; kept as loaded"
        )
    on_cpu = module.weight.device.type in ("cpu", "meta")  # meta: a disk weight, run on cpu
    if precision.kind == "int4" and on_cpu and module.out_features % CPU_INT4_ROWS:
        return (
            f"out_features {module.out_features} is not a multiple of {CPU_INT4_ROWS}, which "
            "torchao's CPU int4 packing needs; kept as loaded"
        )
    return None


def quantize_model(
    model: nn.Module,
    precision_map: Mapping[str, Any],
    *,
    offload_folder: str | os.PathLike[str] | None = None,
    progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
) -> QuantizeReport:
    """Quantize (or cast) every ``nn.Linear`` and fused experts weight a precision map covers.

    Call it after ``load_checkpoint_in_model`` and before ``dispatch_model`` (or pass
    ``precision_map=`` to ``load_checkpoint_and_dispatch``, which does exactly that).

    Args:
        model: a loaded model; weights of ``"disk"`` modules are ``meta`` with entries in
            ``offload_folder``.
        precision_map: ``{module name: precision}``; the longest covering key names a module's
            precision (``""`` covers all); modules no key covers are left as loaded.
        offload_folder: the load's offload folder (needed when a covered weight is on ``meta``).
        progress: Keyword-only. Called with a ``LoadProgress`` (phase ``"quantizing"``): once at
            the start (0 bytes), then after each module, with the weight bytes (as loaded) of
            the modules done so far against those of all the modules it will change.
        cancel: Keyword-only. Checked before every module and before the index is written; a
            cancel raises ``LoadCancelled`` and leaves the offload folder's files and index as
            they were (modules already quantized in memory stay so: discard the model).

    Returns:
        A ``QuantizeReport`` with the bytes of every covered weight, per tier.

    Raises:
        BadInputError: an unknown precision, nf4/fp4 without bitsandbytes, or a precision that
            cannot run where the weight runs (named with module and device; ``backends``).
        CheckpointError: a ``meta`` weight the offload folder does not hold.
        OffloadError: the packed files or the index could not be written (nothing is left).
        LoadCancelled: ``cancel`` was set.

    Example:
        >>> quantize_model(model, {"": "int8"}, offload_folder="offload")  # doctest: +SKIP
    """
    precisions = {key: parse_precision(value) for key, value in precision_map.items()}
    tied = _tied_weights(model)
    writer = DiskWriter(Path(offload_folder)) if offload_folder is not None else None
    done: list[QuantizedModule] = []
    skipped: list[tuple[str, str]] = []
    work: list[tuple[str, nn.Module, str, Precision]] = []
    for name, module in model.named_modules():
        precision = device_for(name, precisions)
        if precision is None:
            continue
        if not isinstance(module, nn.Linear):
            expert_work, expert_skips = fused_experts_work(name, module, precision)
            work.extend(expert_work)
            skipped.extend(expert_skips)
            continue
        weight_name = f"{name}.weight" if name else "weight"
        reason = _skip_reason(module, precision)
        if precision.quantized and weight_name in tied:
            reason = "its weight is tied to another module's; kept as loaded"
        if reason is not None:
            skipped.append((name, reason))
            continue
        work.append((name, module, weight_name, precision))
    _check_offloaded_work(model, work)
    sizes = [_weight_nbytes(item[1], item[2]) for item in work]
    total, bytes_done = sum(sizes), 0
    if progress is not None:
        progress(LoadProgress(0, total, "", "quantizing"))
    try:
        for (name, module, weight_name, precision), nbytes in zip(work, sizes, strict=True):
            if cancel is not None:
                cancel.raise_if_cancelled()
            done.append(_apply_one(module, name, weight_name, precision, writer))
            bytes_done += nbytes
            if progress is not None:
                progress(LoadProgress(bytes_done, total, weight_name, "quantizing"))
        if cancel is not None:
            cancel.raise_if_cancelled()
        if writer is not None and writer.entries:
            writer.commit()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    for name, reason in skipped:
        logger.info("quantize_model: %s: %s", name, reason)
    files = tuple(writer.files) if writer is not None else ()
    return QuantizeReport(tuple(done), tuple(skipped), files)


def _apply_one(
    module: nn.Module,
    name: str,
    weight_name: str,
    precision: Precision,
    writer: DiskWriter | None,
) -> QuantizedModule:
    """Quantize or cast one weight: an ``nn.Linear``'s, or a fused 3-D experts weight.

    For experts, ``name`` and ``weight_name`` are both the parameter's full name.
    """
    attr = weight_name.rpartition(".")[2]
    experts = not isinstance(module, nn.Linear)
    weight = getattr(module, attr)
    on_disk = weight.device.type == "meta"
    if on_disk and writer is None:
        raise CheckpointError(
            f"{weight_name} is on the meta device; pass the load's offload_folder= to quantize "
            "its disk copy"
        )
    if not on_disk:
        check_device(name, weight.device, precision, weight.dtype)
    source = writer.read(weight_name) if on_disk and writer is not None else weight.detach()
    original_nbytes = source.numel() * source.element_size()
    tier = "disk" if on_disk else str(weight.device)
    if not precision.quantized:
        assert precision.dtype is not None
        _cast_module(module, precision.dtype, (attr,) if experts else ("weight", "bias"))
        nbytes = source.numel() * precision.dtype.itemsize
        return QuantizedModule(name, precision.name, tier, nbytes, original_nbytes)
    if experts:
        packed = quantize_experts(source, precision)
        use_eager_experts(module)
    else:
        packed = quantize_weight(source, precision)
    if on_disk and writer is not None:
        writer.write(weight_name, packed)
        placeholder = torch.empty(weight.shape, dtype=packed.dtype, device="meta")
        setattr(module, attr, nn.Parameter(placeholder, requires_grad=False))
    else:
        setattr(module, attr, nn.Parameter(packed, requires_grad=False))
    return QuantizedModule(name, precision.name, tier, stored_nbytes(packed), original_nbytes)


def _cast_module(
    module: nn.Module, dtype: torch.dtype, attrs: tuple[str, ...] = ("weight", "bias")
) -> None:
    """Cast weight and bias; a disk weight keeps its bytes and is cast by the hook per forward."""
    for attr in attrs:
        param = getattr(module, attr)
        if param is None or param.dtype == dtype:
            continue
        device = "meta" if param.device.type == "meta" else param.device
        value = param.detach().to(device=device, dtype=dtype)
        setattr(module, attr, nn.Parameter(value, requires_grad=param.requires_grad))
