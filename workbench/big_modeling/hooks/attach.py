"""Attaching ``AlignDevicesHook`` to a model's modules: one walker per reference entry point.

``attach_execution_device_hook`` (inputs only), ``attach_align_device_hook`` (every module with
tensors, optionally offloaded) and ``attach_align_device_hook_on_blocks`` (per-block devices
and offload flags, as ``dispatch_model`` uses). The hook itself is in ``hooks.align``.

Example:
    >>> import torch
    >>> from workbench.big_modeling.hooks.align import has_offloaded_params
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    >>> attach_align_device_hook(model, "cpu", offload=True)
    >>> model[0].weight.device, has_offloaded_params(model[0])
    (device(type='meta'), True)
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain
from typing import Any

from torch import Tensor, nn

from workbench.big_modeling.devices import DeviceValue
from workbench.big_modeling.hooks.align import AlignDevicesHook
from workbench.big_modeling.hooks.base import add_hook_to_module
from workbench.big_modeling.hooks.tensor_slots import TiedParamsMap, named_module_tensors
from workbench.big_modeling.offload.folder import PrefixedDataset

__all__ = [
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook",
]


def _has_tensors(module: nn.Module) -> bool:
    return next(chain(module.parameters(), module.buffers()), None) is not None


def _child_name(module_name: str, child_name: str) -> str:
    return f"{module_name}.{child_name}" if module_name else child_name


def _prefixed(weights_map: Mapping[str, Tensor] | None, module_name: str) -> Any:
    if weights_map is None or not module_name:
        return weights_map
    return PrefixedDataset(weights_map, f"{module_name}.")


def attach_execution_device_hook(
    module: nn.Module,
    execution_device: DeviceValue,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: TiedParamsMap | None = None,
    *,
    module_name: str = "",
) -> None:
    """Recursively attach hooks that move inputs (and weights, once) to ``execution_device``.

    Modules that already have a hook, or hold no tensors, get none; the walk does not enter
    instances of ``preload_module_classes``.

    Args:
        module: the root module.
        execution_device: the device.
        skip_keys: input/output keys never moved.
        preload_module_classes: class names whose submodules are not visited.
        tied_params_map: shared tie map (see ``AlignDevicesHook``).
        module_name: keyword-only; the dotted name of ``module`` (for events and errors).

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> attach_execution_device_hook(model, "cpu")
        >>> type(model[0]._hf_hook).__name__
        'AlignDevicesHook'
    """
    if "_hf_hook" not in module.__dict__ and _has_tensors(module):
        hook = AlignDevicesHook(
            execution_device,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
            module_name=module_name,
        )
        add_hook_to_module(module, hook)
    if preload_module_classes is not None and type(module).__name__ in preload_module_classes:
        return
    for child_name, child in module.named_children():
        attach_execution_device_hook(
            child,
            execution_device,
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
            tied_params_map=tied_params_map,
            module_name=_child_name(module_name, child_name),
        )


def attach_align_device_hook(
    module: nn.Module,
    execution_device: DeviceValue | None = None,
    offload: bool = False,
    weights_map: Mapping[str, Tensor] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: TiedParamsMap | None = None,
) -> None:
    """Recursively attach an ``AlignDevicesHook`` to every submodule holding direct tensors.

    Instances of ``preload_module_classes`` get one hook that loads all their (sub)tensors at
    the start of their forward, and their children get none.

    Args:
        module: the root module.
        execution_device: where forwards run.
        offload: offload the weights (``meta`` between forwards).
        weights_map: full-name mapping of the root's tensors (each hook sees its prefix).
        offload_buffers: offload buffers too.
        module_name: the dotted name of ``module`` inside ``weights_map``.
        skip_keys: input/output keys never moved.
        preload_module_classes: class names loaded whole at the start of their forward.
        tied_params_map: shared tie map.

    Raises:
        CheckpointError: ``weights_map`` lacks tensors of an offloaded module.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> attach_align_device_hook(model, "cpu", offload=True)
        >>> model(torch.ones(1, 2)).shape
        torch.Size([1, 2])
    """
    full_offload = (
        offload
        and preload_module_classes is not None
        and type(module).__name__ in preload_module_classes
    )
    if full_offload or named_module_tensors(module):
        hook = AlignDevicesHook(
            execution_device=execution_device,
            offload=offload,
            weights_map=_prefixed(weights_map, module_name),
            offload_buffers=offload_buffers,
            place_submodules=full_offload,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
            module_name=module_name,
        )
        add_hook_to_module(module, hook, append=True)
    if full_offload:
        return
    for child_name, child in module.named_children():
        attach_align_device_hook(
            child,
            execution_device=execution_device,
            offload=offload,
            weights_map=weights_map,
            offload_buffers=offload_buffers,
            module_name=_child_name(module_name, child_name),
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
            tied_params_map=tied_params_map,
        )


def attach_align_device_hook_on_blocks(
    module: nn.Module,
    execution_device: DeviceValue | Mapping[str, DeviceValue] | None = None,
    offload: bool | Mapping[str, bool] = False,
    weights_map: Mapping[str, Tensor] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: TiedParamsMap | None = None,
) -> None:
    """Attach hooks block by block: ``execution_device``/``offload`` may map names to values.

    A block with ``offload`` False gets one hook placing all its tensors on its device, and
    execution-device hooks inside; an offloaded block gets offloading hooks on its modules.
    The root (``module_name == ""``) always moves outputs back to the inputs' device.

    Keys may overlap and the most specific wins (as in transformers): for
    ``{"": "cpu", "layers.1": "disk"}`` the root's hook handles only the root's own tensors,
    ``layers.1`` gets offloading hooks, and the root's other children inherit its entry.

    Args:
        module: the root module.
        execution_device: a device, or module name -> device.
        offload: a bool, or module name -> bool.
        weights_map: full-name mapping of the offloaded tensors.
        offload_buffers: offload buffers too.
        module_name: the dotted name of ``module``.
        skip_keys: input/output keys never moved.
        preload_module_classes: class names loaded whole at the start of their forward.
        tied_params_map: shared tie map.

    Example:
        >>> import torch
        >>> from workbench.big_modeling.hooks.align import has_offloaded_params
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        >>> attach_align_device_hook_on_blocks(
        ...     model, {"": "cpu", "0": "cpu", "1": "cpu"}, {"": False, "0": False, "1": True}
        ... )
        >>> has_offloaded_params(model[0]), has_offloaded_params(model[1])
        (False, True)
    """
    if not isinstance(execution_device, Mapping) and not isinstance(offload, Mapping):
        if not offload:
            hook = AlignDevicesHook(
                execution_device=execution_device,
                io_same_device=True,
                skip_keys=skip_keys,
                place_submodules=True,
                tied_params_map=tied_params_map,
                module_name=module_name,
            )
            add_hook_to_module(module, hook)
        else:
            attach_align_device_hook(
                module,
                execution_device=execution_device,
                offload=True,
                weights_map=weights_map,
                offload_buffers=offload_buffers,
                module_name=module_name,
                skip_keys=skip_keys,
                tied_params_map=tied_params_map,
            )
        return
    # Copies: entries inherited by the children of overlapping keys are added while walking.
    if isinstance(execution_device, Mapping):
        execution_device = dict(execution_device)
    else:
        execution_device = dict.fromkeys(offload, execution_device)  # type: ignore[arg-type]
    offload = (
        dict(offload) if isinstance(offload, Mapping) else dict.fromkeys(execution_device, offload)
    )
    _attach_blocks(
        module,
        module_name,
        execution_device,
        offload,
        _key_parents(execution_device.keys() & offload.keys()),
        weights_map=weights_map,
        offload_buffers=offload_buffers,
        preload_module_classes=preload_module_classes,
        common={"skip_keys": skip_keys, "tied_params_map": tied_params_map},
    )


def _key_parents(keys: Any) -> frozenset[str]:
    """Every proper ancestor of a key: ``{"", "layers"}`` for ``layers.1``."""
    parents = set()
    for key in keys:
        while key:
            key = key.rpartition(".")[0]
            parents.add(key)
    return frozenset(parents)


def _attach_blocks(
    module: nn.Module,
    module_name: str,
    execution_device: dict[str, Any],
    offload: dict[str, bool],
    key_parents: frozenset[str],
    *,
    weights_map: Mapping[str, Tensor] | None,
    offload_buffers: bool,
    preload_module_classes: list[str] | None,
    common: dict[str, Any],
) -> None:
    is_key = module_name in execution_device and module_name in offload
    if is_key and module_name in key_parents:
        # A more specific key lies inside: this hook takes only the module's direct tensors,
        # and children without a key of their own inherit this block's entry.
        _attach_direct_hook(
            module, module_name, execution_device, offload, weights_map, offload_buffers, common
        )
        for child_name, child in module.named_children():
            full_name = _child_name(module_name, child_name)
            if full_name not in execution_device and _has_tensors(child):
                execution_device[full_name] = execution_device[module_name]
                offload[full_name] = offload[module_name]
    elif is_key and not offload[module_name]:
        hook = AlignDevicesHook(
            execution_device=execution_device[module_name],
            offload_buffers=offload_buffers,
            io_same_device=module_name == "",
            place_submodules=True,
            module_name=module_name,
            **common,
        )
        add_hook_to_module(module, hook)
        attach_execution_device_hook(
            module, execution_device[module_name], module_name=module_name, **common
        )
        return  # every tensor below is handled: no key lies inside
    elif is_key:
        attach_align_device_hook(
            module,
            execution_device=execution_device[module_name],
            offload=True,
            weights_map=weights_map,
            offload_buffers=offload_buffers,
            module_name=module_name,
            preload_module_classes=preload_module_classes,
            **common,
        )
        if "_hf_hook" not in module.__dict__:
            hook = AlignDevicesHook(
                execution_device=execution_device[module_name],
                io_same_device=module_name == "",
                module_name=module_name,
                **common,
            )
            add_hook_to_module(module, hook)
        attach_execution_device_hook(
            module,
            execution_device[module_name],
            preload_module_classes=preload_module_classes,
            module_name=module_name,
            **common,
        )
        return
    elif module_name == "":
        hook = AlignDevicesHook(
            execution_device=execution_device.get(""), io_same_device=True, **common
        )
        add_hook_to_module(module, hook)
    elif module_name not in key_parents:
        return  # no key here or below: nothing to attach
    for child_name, child in module.named_children():
        _attach_blocks(
            child,
            _child_name(module_name, child_name),
            execution_device,
            offload,
            key_parents,
            weights_map=weights_map,
            offload_buffers=offload_buffers,
            preload_module_classes=preload_module_classes,
            common=common,
        )


def _attach_direct_hook(
    module: nn.Module,
    module_name: str,
    execution_device: dict[str, Any],
    offload: dict[str, bool],
    weights_map: Mapping[str, Tensor] | None,
    offload_buffers: bool,
    common: dict[str, Any],
) -> None:
    """One hook for a block's own tensors, offloaded or placed; the root also restores outputs."""
    offloaded = offload[module_name] and bool(named_module_tensors(module))
    hook = AlignDevicesHook(
        execution_device=execution_device[module_name],
        offload=offloaded,
        io_same_device=module_name == "",
        weights_map=_prefixed(weights_map, module_name) if offloaded else None,
        offload_buffers=offload_buffers,
        module_name=module_name,
        **common,
    )
    add_hook_to_module(module, hook)
