"""What a load or a run should hold per device: the prediction ``memory_reconcile`` sets beside
its measurements.

- weights: the map's checkpoint bytes per device, non-persistent buffers left out on both
  sides (``without_non_persistent_buffers``), a quantized load's at its precisions
  (``quantized_weights_prediction``);
- a run's reserve: the memory model's KV cache and activation peak at the run's real shape
  (``predict_run_reserve``) and the largest offloaded block on the device that runs it
  (``offload_staging_bytes``), and the dense copy nf4/fp4/int8 matmuls dequantize into
  (``dequantize_buffer_prediction``); the CPU matmul workspace is probed apart
  (``gemm_workspace``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from workbench.big_modeling.device_map.coverage import non_persistent_buffer_names
from workbench.big_modeling.device_map.value import device_for
from workbench.big_modeling.devices import device_label
from workbench.big_modeling.planning.device_reserve import reserve_per_device
from workbench.big_modeling.quantization.dense_buffers import (
    DENSE_COPY_KINDS,
    dequantize_buffer_nbytes,
)
from workbench.big_modeling.quantization.precisions import parse_precision
from workbench.big_modeling.quantization.sizes import quantized_weight_nbytes

__all__ = [
    "DENSE_COPY_KINDS",
    "computes_with_dense_copy",
    "dequantize_buffer_prediction",
    "main_device",
    "offload_staging_bytes",
    "predict_run_reserve",
    "quantized_weights_prediction",
    "without_non_persistent_buffers",
]


def without_non_persistent_buffers(
    nbytes: Mapping[str, int],
    sizes: Mapping[str, int],
    device_map: Mapping[str, object],
    model: nn.Module,
) -> dict[str, int]:
    """``nbytes`` (bytes per device of the map's entries, as the module tree counts them) less
    the model's non-persistent buffers (rotary ``inv_freq``, BERT's ``position_ids``).

    No checkpoint holds them, and they are real tensors of the empty model, built before a
    load's CPU baseline; ``resident_weight_bytes`` skips them, so predicted and measured
    weights count the same tensors. (Dispatch moves those of a GPU entry to its GPU, where
    their few bytes are in ``memory_allocated`` unpredicted.)

    Args:
        nbytes: bytes per device label, from ``sizes`` summed over the map's entries.
        sizes: the tree's bytes per module and tensor name (``module_sizes()``); a tied alias
            has no entry and takes nothing off.
        device_map: the map ``nbytes`` was summed over.
        model: the model whose buffers are looked for.

    Example:
        >>> model = nn.Linear(2, 2)
        >>> model.register_buffer("inv_freq", torch.ones(4), persistent=False)
        >>> without_non_persistent_buffers({"cpu": 40}, {"": 40, "inv_freq": 16}, {"": "cpu"}, model)
        {'cpu': 24}
    """
    out = dict(nbytes)
    for name in non_persistent_buffer_names(model):
        device = device_for(name, device_map)
        if device is not None and name in sizes:
            label = device_label(device)
            out[label] = out.get(label, 0) - int(sizes[name])
    return out


def quantized_weights_prediction(
    predicted: Mapping[str, int], report: Any, model: nn.Module
) -> dict[str, int]:
    """The weights per device a quantized load should hold: ``predicted`` (the map's bytes at
    the load dtype) with each weight ``quantize_model`` converted counted at its precision's
    size (``quantization.sizes``, the planner's formula), on the tier it was converted on.

    Args:
        predicted: bytes per device label before quantization.
        report: the ``QuantizeReport`` of the load.
        model: the model the report names modules of.
    """
    out = dict(predicted)
    for converted in report.modules:
        linear = model.get_submodule(converted.name)
        rows, columns = int(linear.out_features), int(linear.in_features)
        dtype = linear.weight.dtype  # a torchao tensor reports the dtype it was made from
        size = quantized_weight_nbytes(converted.precision, rows, columns, dtype)
        out[converted.tier] = out.get(converted.tier, 0) - converted.original_nbytes + size
    return out


def main_device(device_map: Mapping[str, object]) -> str:
    """Where offloaded (cpu/disk) blocks run: the first GPU of the map, else the CPU."""
    accelerators = sorted(d for d in device_map.values() if isinstance(d, int))
    return f"cuda:{accelerators[0]}" if accelerators else "cpu"


def predict_run_reserve(
    config: Any,
    device_map: Mapping[str, object],
    *,
    prompt_tokens: int,
    new_tokens: int,
    dtype: torch.dtype,
) -> dict[str, int]:
    """KV cache plus activation peak per device for one run of this shape (batch 1).

    The cache holds ``prompt_tokens + new_tokens - 1`` positions (the last token is never fed
    back); the activation peak is the prefill's, with the logits of one position when tokens
    are generated (``generate`` keeps 1) and of every prompt position for a single forward
    (``new_tokens=0``). Offloaded layers run, and keep their cache, on the map's main device.

    Seam: this calls the engine's ``reserve_per_device``, the per-device memory model the
    planner's reserve is being wired to (``runtime.planning``); once that module has a runtime
    function for a device map's reserve, call it here so plan and reconciliation share it.

    Raises:
        BadInputError, ValueError, TypeError, AttributeError: the config lacks what the memory
            model needs (not a decoder, unknown attention), as ``reserve_per_device``.
    """
    context = max(1, prompt_tokens + max(new_tokens - 1, 0))
    reserve = reserve_per_device(
        config,
        device_map,
        batch=1,
        context=context,
        model_dtype=dtype,
        logits_to_keep=1 if new_tokens else max(1, prompt_tokens),
        offload_execution_device=main_device(device_map),
        prompt_tokens=max(1, prompt_tokens),
    )
    return {device: item.nbytes for device, item in reserve.items()}


def offload_staging_bytes(
    entry_sizes: Mapping[str, int], device_map: Mapping[str, object]
) -> dict[str, int]:
    """Room an offloaded block's weights take on the device that runs it, during its forward.

    Dispatch brings each offloaded map entry (``"disk"`` and ``"cpu"``) to the GPU that runs
    the model for its forward and drops it after, one at a time (no prefetch): the peak there
    holds the largest such entry. When the CPU runs the model nothing is copied: a disk
    entry's weights are memory-mapped from the offload folder for its forward (file pages,
    which the CPU's anonymous figure does not hold), so there is no room to predict.

    Example:
        >>> offload_staging_bytes({"a": 10, "b": 30, "c": 20}, {"a": 0, "b": "cpu", "c": "disk"})
        {'cuda:0': 30}
        >>> offload_staging_bytes({"a": 10, "c": 20}, {"a": "cpu", "c": "disk"})
        {}
    """
    main = main_device(device_map)
    if main == "cpu":
        return {}
    offloaded = {"cpu", "disk"}
    sizes = [
        int(entry_sizes.get(name, 0))
        for name, device in device_map.items()
        if device_label(device) in offloaded
    ]
    largest = max(sizes, default=0)
    return {main: largest} if largest else {}


def computes_with_dense_copy(precision: str | None) -> bool:
    """Whether ``precision``'s matmuls compute with a dense copy of the weight
    (``DENSE_COPY_KINDS``; an unknown name does not: where it is used, that says so)."""
    try:
        return precision is not None and parse_precision(precision).kind in DENSE_COPY_KINDS
    except ValueError:
        return False


def dequantize_buffer_prediction(
    model: nn.Module, precision_map: Mapping[str, str], device_map: Mapping[str, object]
) -> dict[str, int]:
    """Room the nf4/fp4/int8 weights' dense copies take on each device that runs them.

    Their matmuls compute with the weight dequantized to its compute dtype
    (``computes_with_dense_copy``): on the CPU into one buffer per thread and dtype, grown to
    the largest such weight and kept (``quantization.dense_buffers``, used by ``bnb4_cpu`` and
    ``int8_cpu``); on a GPU bitsandbytes dequantizes a 4-bit weight for each multi-token
    (prefill) matmul and torchao casts an int8 one for every matmul, freed after, so the peak
    holds the largest one. Per
    device: per compute dtype, its largest 2-D weight (one expert of a fused 3-D one) at that
    dtype's bytes. Offloaded (cpu/disk) modules run on the map's main device.

    Args:
        model: the loaded model (an offloaded weight is on ``meta``: only its shape is read).
        precision_map: ``{module name: precision}`` of the modules the load converted.
        device_map: the map the model was dispatched with.

    Example:
        >>> model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 128))
        >>> dequantize_buffer_prediction(model, {"0": "nf4", "1": "int4-g64"}, {"": "cpu"})
        {'cpu': 8192}
    """
    main = main_device(device_map)
    weights: dict[str, list[tuple[tuple[int, ...], torch.dtype]]] = {}
    for name, precision in precision_map.items():
        if not computes_with_dense_copy(precision):
            continue
        placed = device_for(name, device_map)
        label = main if placed is None else device_label(placed)
        runs_on = main if label in ("cpu", "disk") else label
        module = model.get_submodule(name)
        weights.setdefault(runs_on, []).extend(
            (tuple(p.shape), p.dtype) for p in module.parameters(recurse=False) if p.dim() >= 2
        )
    out = {device: dequantize_buffer_nbytes(shapes) for device, shapes in weights.items()}
    return {device: nbytes for device, nbytes in out.items() if nbytes}
