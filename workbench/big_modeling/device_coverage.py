"""Which device a device map gives each tensor of a model, and which parameters are tied.

Example:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> covering_devices(model, {"": "cpu"})
    {'0.weight': 'cpu', '0.bias': 'cpu'}
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from workbench.big_modeling.errors import DeviceMapError


def _shown(names: list[str], limit: int = 20) -> str:
    names = sorted(names, key=str)
    return ", ".join(names[:limit]) + (
        f", ... ({len(names) - limit} more)" if len(names) > limit else ""
    )


def covering_devices(
    model: nn.Module,
    device_map: Mapping[str, int | str],
    *,
    non_persistent_device: int | str | None = None,
) -> dict[str, int | str]:
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
    placement: dict[str, int | str] = {}
    uncovered = []
    for name in names:
        prefix = name
        while True:
            if prefix in device_map:
                placement[name] = device_map[prefix]
                break
            if not prefix:
                if non_persistent_device is not None and name in non_persistent:
                    placement[name] = non_persistent_device
                else:
                    uncovered.append(name)
                break
            prefix = prefix.rpartition(".")[0]
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
    not_names = [key for key in device_map if not isinstance(key, str)]
    if not_names:
        shown = ", ".join(sorted(f"{key!r} ({type(key).__name__})" for key in not_names)[:20])
        raise DeviceMapError(
            f"device_map has {len(not_names)} keys that are not module names: {shown}. Keys are "
            "dotted module names as strings ('model.layers.0', or '' for the whole model)."
        )
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
    owners = set()
    for name in placement:
        prefix = name
        while prefix not in device_map:
            if not prefix:
                owners.add(name.rpartition(".")[0])
                break
            prefix = prefix.rpartition(".")[0]
    return sorted(owners)


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
