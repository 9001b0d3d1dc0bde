"""Plan a checkpoint load before touching anything: keys, ties, devices, shapes and dtypes.

``plan_load`` is a pure function of the model's tensors (names, shapes, dtypes), the checkpoint's
header-only index and the options. Every problem it can find (shape or dtype mismatches, strict
key mismatches, tensors without a device) is raised here, so a bad checkpoint fails before the
model or any offload folder changes.

dtype rules (documented choice, following the reference where it speaks):

- integer and bool tensors are never cast;
- a floating tensor goes to ``float32`` if it belongs to ``keep_in_fp32_modules``, else to
  ``dtype`` when given, else to the model tensor's own dtype (as ``torch.load_state_dict`` and
  the reference do);
- a floating tensor into an integer/bool model tensor, or an integer/bool tensor into a floating
  one, cannot be cast and is refused.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from workbench.big_modeling.device_map.value import device_for
from workbench.big_modeling.dtypes import to_dtype
from workbench.big_modeling.errors import (
    BadInputError,
    CheckpointError,
    DeviceMapError,
    first_names,
)
from workbench.big_modeling.loading.index import CheckpointIndex, TensorInfo


@dataclass(frozen=True, slots=True)
class ModelSlot:
    """One parameter or persistent buffer of the model, with every name it goes by (ties)."""

    names: tuple[str, ...]  # first name is the canonical one
    locations: tuple[tuple[nn.Module, str], ...]  # (owning module, attribute) per name
    is_buffer: bool
    dtype: torch.dtype
    shape: tuple[int, ...]
    device: torch.device
    requires_grad: bool


@dataclass(frozen=True, slots=True)
class LoadStep:
    """Load checkpoint tensor ``info`` into ``slot`` on ``device`` as ``dtype``."""

    info: TensorInfo
    slot: ModelSlot
    device: int | str  # canonical device value, "disk" included; "keep" = where the slot is
    dtype: torch.dtype


@dataclass
class LoadPlan:
    """The steps, in file order, and the key differences found."""

    steps: list[LoadStep]
    missing_keys: list[str]
    unexpected_keys: list[str]
    slots: list[ModelSlot] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(step.info.nbytes for step in self.steps)

    def uses_disk(self) -> bool:
        return any(step.device == "disk" for step in self.steps)


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """Accept ``torch.float16``, ``"float16"``, ``"torch.float16"`` or ``"fp16"``; only floating dtypes.

    Raises:
        BadInputError: an unknown or non-floating dtype.
    """
    parsed = None if dtype is None else to_dtype(dtype)
    if parsed is not None and not parsed.is_floating_point:
        raise BadInputError(
            f"dtype {parsed} is not a floating dtype; only floating weights are cast, so pass e.g. torch.float16"
        )
    return parsed


def model_slots(model: nn.Module) -> list[ModelSlot]:
    """Every parameter and persistent buffer, tied names grouped into one slot, in model order."""
    groups: dict[int, list[tuple[str, nn.Module, str, torch.Tensor, bool]]] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for attr, tensor in module._parameters.items():
            if tensor is not None:
                groups.setdefault(id(tensor), []).append((dot + attr, module, attr, tensor, False))
        persistent_skip = module._non_persistent_buffers_set
        for attr, tensor in module._buffers.items():
            if tensor is not None and attr not in persistent_skip:
                groups.setdefault(id(tensor), []).append((dot + attr, module, attr, tensor, True))
    slots = []
    for members in groups.values():
        seen: dict[str, tuple[nn.Module, str]] = {}
        for name, module, attr, _, _ in members:
            seen.setdefault(name, (module, attr))
        tensor, is_buffer = members[0][3], members[0][4]
        slots.append(
            ModelSlot(
                names=tuple(seen),
                locations=tuple(seen.values()),
                is_buffer=is_buffer,
                dtype=tensor.dtype,
                shape=tuple(tensor.shape),
                device=tensor.device,
                requires_grad=bool(tensor.requires_grad),
            )
        )
    return slots


def _matches_module(name: str, module_names: Iterable[str]) -> bool:
    """``name`` lies under a listed module: its dotted parts appear as whole components."""
    parts = name.split(".")
    for key in module_names:
        key_parts = key.split(".")
        width = len(key_parts)
        if any(parts[i : i + width] == key_parts for i in range(len(parts) - width + 1)):
            return True
    return False


def target_dtype(
    info: TensorInfo,
    slot: ModelSlot,
    dtype: torch.dtype | None,
    keep_in_fp32_modules: list[str],
) -> torch.dtype:
    """The dtype ``info`` is loaded as (see the module doc for the rules).

    Raises:
        CheckpointError: a floating/non-floating mismatch that cannot be cast.
    """
    stored_float = info.dtype.is_floating_point
    if stored_float != slot.dtype.is_floating_point:
        raise CheckpointError(
            f"{info.file}: tensor {info.name!r} is {info.dtype} in the checkpoint but {slot.dtype} in the model; "
            "floating and integer/bool tensors cannot be cast into each other. Use a checkpoint made for this model."
        )
    if not stored_float:
        return info.dtype
    if keep_in_fp32_modules and _matches_module(info.name, keep_in_fp32_modules):
        return torch.float32
    return dtype if dtype is not None else slot.dtype


def plan_load(
    model: nn.Module,
    index: CheckpointIndex,
    *,
    device_map: Mapping[str, int | str] | None,
    dtype: torch.dtype | None,
    keep_in_fp32_modules: list[str] | None,
    offload_buffers: bool,
    strict: bool,
) -> LoadPlan:
    """Match checkpoint tensors to model slots and decide device and dtype for each.

    With ``device_map=None`` each tensor stays where the model has it (meta -> CPU). Buffers of
    modules mapped to ``"disk"`` are loaded to CPU unless ``offload_buffers``.

    Raises:
        CheckpointError: shape or dtype mismatches (all listed), and with ``strict`` any missing
            or unexpected key.
        DeviceMapError: tensors the map gives no device.
    """
    slots = model_slots(model)
    slot_of = {name: slot for slot in slots for name in slot.names}
    unexpected = sorted(name for name in index.tensors if name not in slot_of)
    loaded: dict[int, TensorInfo] = {}
    for name, info in index.tensors.items():
        slot = slot_of.get(name)
        if slot is not None:
            loaded.setdefault(id(slot), info)  # a tie stored twice: the first copy wins
    missing = sorted(name for slot in slots if id(slot) not in loaded for name in slot.names)
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing key(s): {first_names(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s): {first_names(unexpected)}")
        raise CheckpointError(
            f"{index.source}: does not match {type(model).__name__} (strict=True): "
            + "; ".join(parts)
        )
    shape_errors = sorted(
        f"{info.name}: checkpoint {tuple(info.shape)} vs model {slot.shape}"
        for slot in slots
        if (info := loaded.get(id(slot))) is not None and tuple(info.shape) != slot.shape
    )
    if shape_errors:
        raise CheckpointError(
            f"{index.source}: {len(shape_errors)} tensor(s) have a different shape in the checkpoint than in "
            f"{type(model).__name__}: {first_names(shape_errors)}. Use the checkpoint made for this model configuration."
        )
    keep = list(keep_in_fp32_modules or [])
    steps: list[LoadStep] = []
    unplaced: list[str] = []
    order = {name: i for i, name in enumerate(index.tensors)}
    by_file_order = sorted(
        ((info, slot) for slot in slots if (info := loaded.get(id(slot))) is not None),
        key=lambda pair: order[pair[0].name],
    )
    for info, slot in by_file_order:
        device: int | str
        if device_map is None:
            device = "keep"
        else:
            found = [device_for(n, device_map) for n in slot.names]
            if found[0] is None:
                unplaced.append(slot.names[0])
                continue
            device = found[0]
            if len({d for d in found if d is not None}) > 1:
                warnings.warn(
                    f"tied tensors {', '.join(slot.names)} are mapped to different devices ({found}); "
                    f"they stay tied on {device!r}. Put tied modules on one device.",
                    stacklevel=3,
                )
            if device == "disk" and slot.is_buffer and not offload_buffers:
                device = "cpu"
        steps.append(LoadStep(info, slot, device, target_dtype(info, slot, dtype, keep)))
    if unplaced:
        raise DeviceMapError(
            f"device_map gives no device for {len(unplaced)} tensor(s): {first_names(sorted(unplaced))}. "
            "Add a covering module key or a '' entry."
        )
    return LoadPlan(steps, missing, unexpected, slots)


def warn_key_differences(plan: LoadPlan, source: object, model: nn.Module) -> None:
    """Report (sorted names) the unexpected and missing keys of a non-strict load.

    Unexpected keys are logged (``logging.WARNING``, as the reference does: "were not used
    when initializing"); missing keys warn (``UserWarning``), since they leave tensors unloaded.
    """
    name = type(model).__name__
    if plan.unexpected_keys:
        logging.getLogger(__name__).warning(
            "%s: %d checkpoint tensor(s) were not used when initializing %s (it has no such "
            "tensors) and were skipped: %s",
            source,
            len(plan.unexpected_keys),
            name,
            first_names(plan.unexpected_keys),
        )
    if plan.missing_keys:
        warnings.warn(
            f"{source}: {len(plan.missing_keys)} tensor(s) of {name} are not in the checkpoint and were left as they are"
            f" (on meta if the model was built empty): {first_names(plan.missing_keys)}",
            stacklevel=3,
        )
