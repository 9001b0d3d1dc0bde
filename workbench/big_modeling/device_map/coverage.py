"""Which device a device map gives each tensor of a model, and which parameters are tied.

``resolve_device_map`` (strict) and ``check_device_map`` (the reference's, warning on unknown
keys) check a map against a model; ``covering_devices`` is the engine's form for dispatch.

Example:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> covering_devices(model, {"": "cpu"})
    {'0.weight': 'cpu', '0.bias': 'cpu'}
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from torch import nn

from workbench.big_modeling.device_map.value import (
    DeviceMap,
    covering_key,
    refuse_non_string_keys,
)
from workbench.big_modeling.devices import Device, DeviceValue
from workbench.big_modeling.errors import DeviceMapError

__all__ = [
    "check_device_map",
    "check_map_keys",
    "covering_devices",
    "non_persistent_buffer_names",
    "resolve_device_map",
    "tied_parameter_groups",
    "uncovered_owners",
]


def _shown(names: list[str], limit: int = 20) -> str:
    names = sorted(names, key=str)
    return ", ".join(names[:limit]) + (
        f", ... ({len(names) - limit} more)" if len(names) > limit else ""
    )


def _listing(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(repr(name) for name in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def resolve_device_map(
    model: nn.Module, device_map: Mapping[str, DeviceValue]
) -> dict[str, Device]:
    """The device of every parameter and buffer under ``device_map`` (most specific key wins).

    Raises:
        DeviceMapError: listing, sorted, the keys that are not strings, the values that are
            not devices, the keys that are not modules or tensors of the model, or the tensors
            no key covers.

    Example:
        >>> resolve_device_map(nn.Linear(2, 2), {"": "cpu", "bias": 0})
        {'weight': 'cpu', 'bias': 0}
    """
    devices = DeviceMap.of(device_map)
    modules = {name for name, _ in model.named_modules(remove_duplicate=False)}
    tensors = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    tensors += [name for name, _ in model.named_buffers(remove_duplicate=False)]
    unknown = sorted(key for key in devices if key not in modules and key not in set(tensors))
    if unknown:
        raise DeviceMapError(
            f"device_map names {len(unknown)} keys that are not modules or tensors of "
            f"{type(model).__name__}: {_listing(unknown)}. Check the spelling or remove them."
        )
    resolved: dict[str, Device] = {}
    uncovered: list[str] = []
    for name in tensors:
        device = devices.device_for(name)
        if device is None:
            uncovered.append(name)
        else:
            resolved[name] = device
    if uncovered:
        raise DeviceMapError(
            f"device_map gives no device for {len(uncovered)} tensors: "
            f"{_listing(sorted(uncovered))}. Add a covering key or a '' entry."
        )
    return resolved


def check_device_map(model: nn.Module, device_map: Mapping[str, DeviceValue]) -> None:
    """Check that ``device_map`` places every parameter and buffer of ``model`` (the reference's).

    Each tensor is covered by its most specific key (a key that is its name or a dotted prefix
    of it; ``""`` covers everything). Keys that name neither a submodule nor a tensor of the
    model only warn, as in the reference, and are ignored; ``resolve_device_map`` is the strict
    form that refuses them (the GUI and CLI check maps with it). Linear in the number of tensors.

    Raises:
        DeviceMapError: listing, sorted, the values that are not devices or the tensors no key
            covers.

    Warns:
        UserWarning: "The following device_map keys do not match any submodules in the model:
            [...]", every such key listed.

    Example:
        >>> check_device_map(nn.Linear(2, 2), {"weight": 0})
        Traceback (most recent call last):
        ...
        workbench.big_modeling.errors.DeviceMapError: device_map gives no device for 1 tensors: 'bias'. Add a covering key or a '' entry.
    """
    names = {name for name, _ in model.named_modules(remove_duplicate=False)}
    names.update(name for name, _ in model.named_parameters(remove_duplicate=False))
    names.update(name for name, _ in model.named_buffers(remove_duplicate=False))
    unknown = [key for key in device_map if key not in names]
    if unknown:
        warnings.warn(
            f"The following device_map keys do not match any submodules in the model: {unknown}. "
            "They are ignored; check their spelling against model.named_modules().",
            UserWarning,
            stacklevel=2,
        )
        device_map = {key: value for key, value in device_map.items() if key in names}
    resolve_device_map(model, device_map)


def covering_devices(
    model: nn.Module,
    device_map: Mapping[str, Device],
    *,
    non_persistent_device: Device | None = None,
) -> dict[str, Device]:
    """Map every parameter and buffer name of ``model`` to the device of its longest covering key.

    Args:
        model: the model.
        device_map: module (or tensor) name -> normalised device.
        non_persistent_device: keyword-only; when given, non-persistent buffers (not in the
            state dict, e.g. rotary ``inv_freq``) that no key covers get this device instead of
            being an error, as Accelerate tolerates (its coverage check reads the state dict).

    Returns:
        Tensor name -> device, tied names included.

    Raises:
        DeviceMapError: keys naming no module or tensor of the model, or tensors no key covers
            (both listed, sorted).
    """
    check_map_keys(model, device_map)
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    names += [name for name, _ in model.named_buffers(remove_duplicate=False)]
    non_persistent = non_persistent_buffer_names(model) if non_persistent_device is not None else ()
    placement: dict[str, Device] = {}
    uncovered = []
    for name in names:
        key = covering_key(name, device_map)
        if key is not None:
            placement[name] = device_map[key]
        elif non_persistent_device is not None and name in non_persistent:
            placement[name] = non_persistent_device
        else:
            uncovered.append(name)
    if uncovered:
        raise DeviceMapError(
            f"device_map gives no device for {len(uncovered)} tensors: {_shown(uncovered)}. "
            "Add a covering key or a '' entry."
        )
    return placement


def check_map_keys(model: nn.Module, device_map: Mapping[str, object]) -> None:
    """Refuse keys of ``device_map`` that name no module, parameter or buffer of ``model``.

    Raises:
        DeviceMapError: keys that are not strings (``{0: "cpu"}``), or the unknown keys,
            listed sorted.

    Example:
        >>> import torch
        >>> check_map_keys(torch.nn.Sequential(torch.nn.Linear(2, 2)), {"1": "cpu"})
        Traceback (most recent call last):
        ...
        workbench.big_modeling.errors.DeviceMapError: device_map names 1 modules the model does not have: 1. Check the spelling against model.named_modules().
    """
    refuse_non_string_keys(device_map)
    known = {name for name, _ in model.named_modules(remove_duplicate=False)}
    known.update(name for name, _ in model.named_parameters(remove_duplicate=False))
    known.update(name for name, _ in model.named_buffers(remove_duplicate=False))
    unknown = [key for key in device_map if key not in known]
    if unknown:
        raise DeviceMapError(
            f"device_map names {len(unknown)} modules the model does not have: {_shown(unknown)}. "
            "Check the spelling against model.named_modules()."
        )


def non_persistent_buffer_names(model: nn.Module) -> set[str]:
    """Full names of the buffers registered with ``persistent=False`` (tied names included).

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> model[0].register_buffer("scratch", torch.zeros(2), persistent=False)
        >>> non_persistent_buffer_names(model)
        {'0.scratch'}
    """
    return {
        f"{prefix}.{attr}" if prefix else attr
        for prefix, owner in model.named_modules(remove_duplicate=False)
        for attr in owner._non_persistent_buffers_set
        if owner._buffers.get(attr) is not None
    }


def uncovered_owners(
    placement: Mapping[str, object], device_map: Mapping[str, object]
) -> list[str]:
    """Modules owning tensors of ``placement`` that no key of ``device_map`` covers, sorted."""
    return sorted(
        {name.rpartition(".")[0] for name in placement if covering_key(name, device_map) is None}
    )


def tied_parameter_groups(model: nn.Module) -> list[list[str]]:
    """Groups of parameter names sharing one ``Parameter`` object, each sorted.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        >>> model[1].weight = model[0].weight
        >>> tied_parameter_groups(model)
        [['0.weight', '1.weight']]
    """
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    return sorted(sorted(group) for group in by_id.values() if len(group) > 1)
