"""Quantize a loaded model's ``nn.Linear`` weights per a precision map, with torchao, on CPU.

Which library and why (measured on this project's CPU machine, torch 2.13 CPU, torchao 0.18):

- ``int8``: ``Int8WeightOnlyConfig`` -> ``Int8Tensor`` (int8 per output channel + fp32 scale);
  runs on CPU (``bfloat16[1024, 1024]`` decode matmul 0.6x the bf16 time).
- ``int4-g*``: torchao's CPU int4 layout, ``PrototypeInt4WeightOnlyConfig`` ->
  ``Int4OpaqueTensor`` (two int4 per byte, tinygemm CPU kernel ``_weight_int4pack_mm_for_cpu``,
  bf16 scale+zero per group). The stable ``Int4WeightOnlyConfig`` layouts all fail on CPU in 0.18
  (``plain`` needs mslk, ``plain_int32`` refuses cpu, ``tile_packed_to_4d`` needs CUDA), and
  ``IntxWeightOnlyConfig(int4)`` keeps one int4 per *byte*, so it would not save the memory the
  plan promises.
- ``fp8``: ``Float8WeightOnlyConfig`` -> ``Float8Tensor`` (e4m3 + fp32 scale per row).
- ``nf4``/``fp4``: no CPU load path here yet (they are planned, not loaded): ``BadInputError``.
- plain dtypes: the weight (and bias) are cast.

Tiers: a module whose weight is a real tensor (cpu) is quantized in place. A module whose weight
is on ``meta`` with an entry in the offload folder (``"disk"`` in the device map) is read from the
folder one module at a time, quantized on the CPU, and its packed inner tensors are written ONCE
to ``<weight>.quantized-<id>.safetensors`` in the folder; the index entry of the weight becomes a
``"torchao"`` record naming those tensors, and ``OffloadedWeightsLoader`` rebuilds the torchao
weight lazily each time a hook brings the module in (see ``packed.read_packed_entry``). The model
keeps a ``meta`` placeholder. Quantized modules run on the CPU execution device.

Example:
    >>> report = quantize_model(model, {"": "bfloat16", "layers.0": "int8"})  # doctest: +SKIP
    >>> report.nbytes_by_tier()  # doctest: +SKIP
    {'cpu': 1310720}
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn
from torchao.core.config import AOBaseConfig
from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

from workbench.big_modeling.atomic import atomic_path
from workbench.big_modeling.device_map.coverage import tied_parameter_groups
from workbench.big_modeling.device_map.value import device_for
from workbench.big_modeling.dtypes import dtype_name
from workbench.big_modeling.errors import BadInputError, CheckpointError
from workbench.big_modeling.offload.folder import (
    OffloadedWeightsLoader,
    load_offload_index,
    save_offload_index,
)
from workbench.big_modeling.quantization.keep_high_precision import default_keep_high_precision
from workbench.big_modeling.quantization.packed import flatten_packed, is_packed, stored_nbytes
from workbench.big_modeling.quantization.precisions import Precision, parse_precision

logger = logging.getLogger(__name__)

PACKED_FILE_PATTERN = re.compile(r".+\.quantized-[0-9a-f]{8}\.safetensors")
"""Names of the packed-weight files ``quantize_model`` writes into an offload folder."""


@dataclass(frozen=True)
class QuantizedModule:
    """One ``nn.Linear`` after ``quantize_model``.

    Attributes:
        name: the module name (``"model.layers.3.mlp.up_proj"``).
        precision: the canonical precision name applied (``"int4-g64"``, ``"bfloat16"``).
        tier: ``"cpu"`` (quantized in place) or ``"disk"`` (packed tensors in the offload folder).
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


def torchao_config(precision: Precision | str) -> AOBaseConfig | None:
    """The torchao weight-only config for a precision; ``None`` for a plain dtype.

    Raises:
        BadInputError: ``nf4``/``fp4``, which have no CPU load path in this workbench yet.

    Example:
        >>> type(torchao_config("int8")).__name__
        'Int8WeightOnlyConfig'
    """
    precision = parse_precision(precision)
    if precision.kind == "int8":
        return Int8WeightOnlyConfig()
    if precision.kind == "int4":
        # set_inductor_config=False: do not change torch._inductor globals for the whole process
        return PrototypeInt4WeightOnlyConfig(
            group_size=precision.group_size or 128, set_inductor_config=False
        )
    if precision.kind == "fp8":
        return Float8WeightOnlyConfig()
    if precision.kind in ("nf4", "fp4"):
        raise BadInputError(
            f"precision {precision.name} can be planned but not loaded on this machine (no CPU "
            "load path for NF4/FP4 yet); load with int8, int4-g32/64/128 or fp8 instead"
        )
    return None


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


def _quantize_tensor(weight: torch.Tensor, config: AOBaseConfig) -> torch.Tensor:
    """A packed copy of a CPU weight (``quantize_`` on a throwaway one-weight module)."""
    holder = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    holder.weight = nn.Parameter(weight, requires_grad=False)
    quantize_(holder, config)
    if not is_packed(holder.weight):
        raise BadInputError(
            f"torchao left a {list(weight.shape)} weight unquantized under {type(config).__name__}"
        )
    return holder.weight


def _skip_reason(module: nn.Linear, precision: Precision) -> str | None:
    if precision.kind == "int4" and module.in_features % (precision.group_size or 128):
        return (
            f"in_features {module.in_features} is not a multiple of the int4 group size "
            f"{precision.group_size}; kept as loaded"
        )
    return None


class _DiskWriter:
    """Writes packed weights of disk modules to the offload folder; index merged at ``commit``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.weights = OffloadedWeightsLoader(save_folder=folder)
        self.entries: dict[str, dict[str, Any]] = {}
        self.files: list[Path] = []
        self._id = uuid.uuid4().hex[:8]

    def read(self, weight_name: str) -> torch.Tensor:
        if weight_name not in self.weights.index:
            raise CheckpointError(
                f"{weight_name} is on the meta device and offload folder {self.folder} has no "
                "entry for it; load the checkpoint with this offload folder before quantizing."
            )
        return self.weights[weight_name]

    def write(self, weight_name: str, packed: torch.Tensor) -> None:
        inner, record = flatten_packed(packed, where=weight_name)
        file = self.folder / f"{weight_name}.quantized-{self._id}.safetensors"
        keys = {name: f"{weight_name}:{name}" for name in inner}
        with atomic_path(file) as tmp:
            save_file({keys[name]: tensor for name, tensor in inner.items()}, str(tmp))
        self.files.append(file)
        for name, tensor in inner.items():
            self.entries[keys[name]] = {
                "dtype": dtype_name(tensor.dtype),
                "shape": list(tensor.shape),
                "safetensors_file": str(file.absolute()),
                "weight_name": keys[name],
            }
        self.entries[weight_name] = {
            "dtype": record["dtype"],
            "shape": record["shape"],
            "torchao": {
                "type": record["type"],
                "attributes": record["attributes"],
                "tensors": keys,
            },
        }

    def commit(self) -> None:
        """Merge the entries into ``index.json`` (atomic), then drop unreferenced packed files."""
        save_offload_index(self.entries, self.folder)
        referenced = {
            Path(info["safetensors_file"]).name
            for info in load_offload_index(self.folder).values()
            if "safetensors_file" in info
        }
        for path in self.folder.iterdir():
            if PACKED_FILE_PATTERN.fullmatch(path.name) and path.name not in referenced:
                path.unlink(missing_ok=True)  # a live model's memory map stays valid (POSIX)

    def abort(self) -> None:
        for file in self.files:
            file.unlink(missing_ok=True)


def quantize_model(
    model: nn.Module,
    precision_map: Mapping[str, Any],
    *,
    offload_folder: str | os.PathLike[str] | None = None,
) -> QuantizeReport:
    """Quantize (or cast) every ``nn.Linear`` a precision map covers, where its weight lives.

    Call it after ``load_checkpoint_in_model`` and before ``dispatch_model`` (or pass
    ``precision_map=`` to ``load_checkpoint_and_dispatch``, which does exactly that).

    Args:
        model: a loaded model; weights of ``"disk"`` modules are ``meta`` with entries in
            ``offload_folder``.
        precision_map: ``{module name: precision}``; the longest covering key names a module's
            precision (``""`` covers all); modules no key covers are left as loaded.
        offload_folder: the load's offload folder (needed when a covered weight is on ``meta``).

    Returns:
        A ``QuantizeReport`` with the bytes of every covered weight, per tier.

    Raises:
        BadInputError: an unknown precision, a precision with no CPU load path (``nf4``), or a
            quantized precision for a weight on an accelerator.
        CheckpointError: a ``meta`` weight the offload folder does not hold.
        OffloadError: the packed files or the index could not be written (nothing is left).

    Example:
        >>> quantize_model(model, {"": "int8"}, offload_folder="offload")  # doctest: +SKIP
    """
    precisions = {key: parse_precision(value) for key, value in precision_map.items()}
    tied = _tied_weights(model)
    writer = _DiskWriter(Path(offload_folder)) if offload_folder is not None else None
    done: list[QuantizedModule] = []
    skipped: list[tuple[str, str]] = []
    try:
        for name, module in model.named_modules():
            precision = device_for(name, precisions)
            if precision is None or not isinstance(module, nn.Linear):
                continue
            weight_name = f"{name}.weight" if name else "weight"
            reason = _skip_reason(module, precision)
            if precision.quantized and weight_name in tied:
                reason = "its weight is tied to another module's; kept as loaded"
            if reason is not None:
                skipped.append((name, reason))
                continue
            done.append(_apply_one(module, name, weight_name, precision, writer))
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
    module: nn.Linear,
    name: str,
    weight_name: str,
    precision: Precision,
    writer: _DiskWriter | None,
) -> QuantizedModule:
    weight = module.weight
    on_disk = weight.device.type == "meta"
    if on_disk and writer is None:
        raise CheckpointError(
            f"{weight_name} is on the meta device; pass the load's offload_folder= to quantize "
            "its disk copy"
        )
    if not on_disk and weight.device.type != "cpu" and precision.quantized:
        raise BadInputError(
            f"{name}: quantized loads run on the CPU tier here; its weight is on {weight.device}. "
            "Map the module to cpu or disk, or keep it in a plain dtype."
        )
    source = writer.read(weight_name) if on_disk and writer is not None else weight.detach()
    original_nbytes = source.numel() * source.element_size()
    config = torchao_config(precision)
    if config is None:
        assert precision.dtype is not None
        _cast_module(module, precision.dtype)
        nbytes = source.numel() * precision.dtype.itemsize
        tier = "disk" if on_disk else "cpu"
        return QuantizedModule(name, precision.name, tier, nbytes, original_nbytes)
    packed = _quantize_tensor(source, config)
    if on_disk and writer is not None:
        writer.write(weight_name, packed)
        module.weight = nn.Parameter(
            torch.empty(weight.shape, dtype=packed.dtype, device="meta"), requires_grad=False
        )
    else:
        module.weight = nn.Parameter(packed, requires_grad=False)
    tier = "disk" if on_disk else "cpu"
    return QuantizedModule(name, precision.name, tier, stored_nbytes(packed), original_nbytes)


def _cast_module(module: nn.Linear, dtype: torch.dtype) -> None:
    """Cast weight and bias; a disk weight keeps its bytes and is cast by the hook per forward."""
    for attr in ("weight", "bias"):
        param = getattr(module, attr)
        if param is None or param.dtype == dtype:
            continue
        device = "meta" if param.device.type == "meta" else param.device
        value = param.detach().to(device=device, dtype=dtype)
        setattr(module, attr, nn.Parameter(value, requires_grad=param.requires_grad))
