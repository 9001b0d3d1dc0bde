"""Layer-by-layer verification, for models whose undispatched copy does not fit in CPU RAM.

One forward of the dispatched model records every unit's inputs and output (units: the
no-split blocks, plus modules with their own weights outside any block, e.g. embeddings, the
final norm, the head). Then, one unit at a time, a CPU copy of that unit is built from a fresh
empty model, filled from the checkpoint's safetensors files (read with ``safetensors`` itself,
not with our engine), run on the recorded inputs and compared with the recorded output. Peak
memory: one unit's weights plus the recorded activations of a short prompt.

The worst unit is named in the result, which also localises a corrupt weight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from safetensors import safe_open

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.progress import CancelToken
from workbench.models import open_model
from workbench.runtime.inference import execution_device
from workbench.runtime.model_inputs import (
    ModelInputs,
    check_positions,
    model_dtype,
    prepare_inputs,
)
from workbench.runtime.protocol import Event, Phase, Verify, VerifyResult
from workbench.runtime.verify_compare import compare_outputs, forward_kwargs

logger = logging.getLogger(__name__)


def verification_units(model: torch.nn.Module, block_classes: set[str]) -> list[str]:
    """Blocks, then modules with direct weights outside blocks, in ``named_modules`` order."""
    units: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(u + ".") for u in units if u) or name in units:
            continue
        is_block = type(module).__name__ in block_classes
        has_own = any(True for _ in module.parameters(recurse=False))
        if name and (is_block or has_own):
            units.append(name)
    return units


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, tuple):
        return tuple(_to_cpu(v) for v in value)
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _first_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value:
        return _first_tensor(value[0])
    for attr in ("last_hidden_state", "logits", "hidden_states"):
        inner = getattr(value, attr, None)
        if isinstance(inner, torch.Tensor):
            return inner
    raise TypeError(f"no tensor in a {type(value).__name__} output")


def record_units(
    model: torch.nn.Module, units: list[str], inputs: ModelInputs
) -> dict[str, tuple[tuple, dict, torch.Tensor]]:
    """Run one forward, keeping each unit's first call: (args, kwargs, output) on the CPU."""
    records: dict[str, tuple[tuple, dict, torch.Tensor]] = {}
    pending: dict[str, tuple[tuple, dict]] = {}
    handles = []
    modules = dict(model.named_modules())
    for name in units:

        def pre(module: Any, args: tuple, kwargs: dict, name: str = name) -> None:
            if name not in records:
                pending[name] = (_to_cpu(args), _to_cpu(kwargs))

        def post(module: Any, args: tuple, kwargs: dict, output: Any, name: str = name) -> None:
            if name not in records and name in pending:
                a, k = pending.pop(name)
                records[name] = (a, k, _first_tensor(output).detach().to("cpu", copy=True))

        module = modules[name]
        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    try:
        with torch.inference_mode():
            model(**forward_kwargs(model, inputs))
    finally:
        for handle in handles:
            handle.remove()
    return records


class _CheckpointTensors:
    """Reads single tensors from the checkpoint's safetensors files (tied names resolved)."""

    def __init__(self, opened: Any) -> None:
        checkpoint = opened.checkpoint
        if checkpoint is None:
            raise BadInputError(f"{opened.source}: no checkpoint to verify against")
        self._infos = checkpoint.tensors
        self._aliases: dict[str, str] = {}
        for group in getattr(opened, "tied_groups", None) or []:
            present = [n for n in group if n in self._infos]
            for name in group:
                if present and name not in self._infos:
                    self._aliases[name] = present[0]

    def __contains__(self, name: str) -> bool:
        return name in self._infos or name in self._aliases

    def get(self, name: str) -> torch.Tensor:
        info = self._infos[self._aliases.get(name, name)]
        if not info.is_safetensors:
            raise BadInputError(
                f"{info.file}: layer-by-layer verify reads safetensors only; convert the "
                "checkpoint or verify with enough RAM for a full copy"
            )
        with safe_open(str(info.file), framework="pt") as handle:
            return handle.get_tensor(info.name)


def build_unit(
    fresh_model: torch.nn.Module,
    dispatched: torch.nn.Module,
    name: str,
    tensors: _CheckpointTensors,
    dtype: torch.dtype,
) -> torch.nn.Module:
    """A CPU copy of unit ``name`` with the checkpoint's weights (buffers the checkpoint lacks
    are copied from the dispatched model, where they are real)."""
    unit = fresh_model.get_submodule(name).to_empty(device="cpu")
    live = dispatched.get_submodule(name)
    live_buffers = dict(live.named_buffers())
    with torch.no_grad():
        for key, target in [*unit.named_parameters(), *unit.named_buffers()]:
            full = f"{name}.{key}"
            if full in tensors:
                value = tensors.get(full)
            elif key in live_buffers and live_buffers[key].device.type != "meta":
                value = live_buffers[key]
            else:
                raise BadInputError(
                    f"verify: {full} is neither in the checkpoint nor a real buffer"
                )
            if value.is_floating_point() and target.is_floating_point():
                value = value.to(dtype if key not in live_buffers else target.dtype)
            target.data = value.to("cpu").reshape(target.shape).clone()
    return unit.eval()


def run_verify_layers(
    loaded: Any, request: Verify, token: CancelToken, emit: Callable[[Event], None]
) -> VerifyResult:
    """Verify ``loaded`` unit by unit; the result names the unit with the largest difference."""
    rid = request.request_id
    model = loaded.model
    blocks = set(getattr(loaded.opened, "no_split_modules", None) or [])
    units = verification_units(model, blocks)
    inputs = prepare_inputs(loaded, request.prompt, request.synthetic_tokens)
    check_positions(loaded, inputs.tokens)
    emit(Phase(rid, "verify: recording units"))
    records = record_units(model, units, inputs.to(execution_device(loaded.device_map)))
    token.raise_if_cancelled()
    fresh = open_model(loaded.opened.source).model
    tensors = _CheckpointTensors(loaded.opened)
    dtype = model_dtype(model)
    worst: tuple[float, str, VerifyResult] | None = None
    all_passed, all_exact, worst_rel = True, True, 0.0
    for index, name in enumerate(units):
        if name not in records:
            continue  # never called in this forward (e.g. an unused head)
        token.raise_if_cancelled()
        emit(Phase(rid, f"verify: unit {index + 1}/{len(units)} {name}"))
        args, kwargs, recorded = records.pop(name)
        unit = build_unit(fresh, model, name, tensors, dtype)
        with torch.inference_mode():
            expected = _first_tensor(unit(*args, **kwargs))
        unit.to_empty(device="meta")  # give the unit's weights back before the next one
        result = compare_outputs(recorded, expected, atol=request.atol, rtol=request.rtol)
        all_passed &= result.passed
        all_exact &= result.exact
        worst_rel = max(worst_rel, result.max_rel_diff)
        if worst is None or result.max_abs_diff > worst[0]:
            worst = (result.max_abs_diff, name, result)
    if worst is None:
        raise BadInputError("verify: the forward called none of the model's units")
    _, worst_name, worst_result = worst
    return VerifyResult(
        passed=all_passed,
        max_abs_diff=worst_result.max_abs_diff,
        max_rel_diff=worst_rel,
        exact=all_exact,
        reference=f"cpu, layer by layer over {len(units)} units (safetensors, no dispatch)",
        output_shape=worst_result.output_shape,
        worst_position=worst_result.worst_position,
        worst_module=worst_name if worst_result.max_abs_diff > 0 else "",
    )
