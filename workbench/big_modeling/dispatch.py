"""Dispatch a model along a device map; full CPU and disk offload.

Example:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    >>> model = cpu_offload(model, execution_device="cpu")
    >>> model(torch.ones(1, 2)).shape
    torch.Size([1, 2])
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from workbench.big_modeling.device_map.coverage import (
    covering_devices,
    non_persistent_buffer_names,
    tied_parameter_groups,
    uncovered_owners,
)
from workbench.big_modeling.device_map.value import normalize_device_map
from workbench.big_modeling.devices import (
    DeviceValue,
    check_devices_available,
    normalize_device,
    to_torch_device,
)
from workbench.big_modeling.errors import CheckpointError, DeviceMapError
from workbench.big_modeling.hooks.align import AlignDevicesHook
from workbench.big_modeling.hooks.attach import (
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
)
from workbench.big_modeling.hooks.base import add_hook_to_module
from workbench.big_modeling.hooks.prefetch import enable_prefetch
from workbench.big_modeling.hooks.tensor_slots import TiedParamsMap, tie_key
from workbench.big_modeling.offload.folder import OffloadedWeightsLoader, offload_state_dict

logger = logging.getLogger(__name__)

__all__ = ["cpu_offload", "disk_offload", "dispatch_model"]


def _main_device(device_map: Mapping[str, int | str], main_device: DeviceValue | None) -> int | str:
    if main_device is not None:
        return normalize_device(main_device)
    values = list(device_map.values())
    accelerators = [device for device in values if device not in ("cpu", "disk")]
    return accelerators[0] if accelerators else "cpu"


def _meta_error(names: list[str], what: str) -> CheckpointError:
    shown = ", ".join(sorted(names)[:20]) + (", ..." if len(names) > 20 else "")
    return CheckpointError(
        f"dispatch_model: {len(names)} tensors {what} are still on the meta device: {shown}. "
        "Load their weights first (load_checkpoint_in_model), or map their modules to 'disk' "
        "with an offload folder (or offload_index) that holds them."
    )


def _has_index(offload_dir: str | os.PathLike[str] | None) -> bool:
    return offload_dir is not None and (Path(offload_dir) / "index.json").is_file()


def dispatch_model(
    model: nn.Module,
    device_map: Mapping[str, DeviceValue],
    main_device: DeviceValue | None = None,
    state_dict: Mapping[str, Tensor] | None = None,
    offload_dir: str | os.PathLike[str] | None = None,
    offload_index: Mapping[str, Any] | None = None,
    offload_buffers: bool = False,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
    *,
    prefetch: bool = False,
) -> nn.Module:
    """Dispatch ``model`` along ``device_map``: weights where the map says, hooks to run it.

    With more than one device in the map (or ``force_hooks``), every block gets an
    ``AlignDevicesHook``: blocks on an accelerator run there; ``"cpu"`` blocks run on the main
    device (offloaded unless the main device is the CPU); ``"disk"`` blocks are read from
    ``offload_dir``/``offload_index`` for each forward. Outputs come back on the inputs' device.

    Args:
        model: the model (weights loaded, or on ``meta`` where offloaded).
        device_map: module name -> device (int, ``"cuda:1"``, ``"cpu"``, ``"disk"``). Keys
            may overlap; the most specific wins (``{"": "cpu", "layers.1": "disk"}``). Modules
            whose only uncovered tensors are non-persistent buffers (rotary ``inv_freq``) run
            on the main device, their buffers moved there once.
        main_device: where inputs go and offloaded blocks run; default: the first device of
            the map that is not cpu/disk, else ``"cpu"`` (so an all-``"disk"`` map runs on
            the CPU, as in the reference).
        state_dict: CPU copies of the ``"cpu"`` blocks' tensors (taken from the model when None).
        offload_dir: folder of the ``"disk"`` blocks' tensors; when it has no ``index.json``,
            they are offloaded there now.
        offload_index: name -> info entries of already offloaded tensors (default: the
            folder's index).
        offload_buffers: offload buffers with the weights.
        skip_keys: input/output keys never moved (e.g. ``"past_key_values"``).
        preload_module_classes: class names loaded whole at the start of their forward.
        force_hooks: attach hooks even when the map names a single device.
        prefetch: keyword-only extra; fetch the next offloaded module's weights while the
            current one computes (order learned on the first forward; see ``prefetch.py``).

    Returns:
        The model, with ``model.hf_device_map`` set (normalised device values).

    Raises:
        DeviceMapError: the map misses tensors, names unknown modules or devices, or has
            disk entries without an offload folder/index.
        CheckpointError: tensors still on ``meta`` that no offload source provides.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        >>> model = dispatch_model(model, {"0": "cpu", "1": "cpu"}, force_hooks=True)
        >>> model.hf_device_map
        {'0': 'cpu', '1': 'cpu'}
    """
    device_map = normalize_device_map(device_map)
    main = _main_device(device_map, main_device)
    placement = covering_devices(model, device_map, non_persistent_device=main)
    check_devices_available(device_map, allow_meta=True)  # cuda:99 named, not an assert
    devices = set(device_map.values())
    # As the reference: a "disk" entry always needs hooks; an all-disk map runs on the CPU.
    if len(devices) > 1 or "disk" in devices or force_hooks:
        _dispatch_with_hooks(
            model,
            device_map,
            placement,
            main=main,
            state_dict=state_dict,
            offload_dir=offload_dir,
            offload_index=offload_index,
            offload_buffers=offload_buffers,
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
            prefetch=prefetch,
        )
    else:
        (device,) = devices
        on_meta = [name for name, tensor in _named_tensors(model) if tensor.device.type == "meta"]
        if on_meta and device != "meta":
            raise _meta_error(on_meta, f"mapped to {device!r}")
        model.to(to_torch_device(device))
    model.hf_device_map = dict(device_map)
    return model


def _named_tensors(model: nn.Module) -> list[tuple[str, Tensor]]:
    params = model.named_parameters(remove_duplicate=False)
    buffers = model.named_buffers(remove_duplicate=False)
    return [*params, *buffers]


def _dispatch_with_hooks(
    model: nn.Module,
    device_map: dict[str, int | str],
    placement: dict[str, int | str],
    *,
    main: int | str,
    state_dict: Mapping[str, Tensor] | None,
    offload_dir: str | os.PathLike[str] | None,
    offload_index: Mapping[str, Any] | None,
    offload_buffers: bool,
    skip_keys: str | list[str] | None,
    preload_module_classes: list[str] | None,
    prefetch: bool,
) -> None:
    offloaded = {"disk"} if main in ("cpu", "mps") else {"cpu", "disk"}
    model_state = model.state_dict(keep_vars=True)
    if main != "cpu" and state_dict is None:
        state_dict = {
            name: tensor.detach().to("cpu")
            for name, tensor in model_state.items()
            if placement.get(name) == "cpu" and tensor.device.type != "meta"
        }
    disk_names = [name for name in model_state if placement.get(name) == "disk"]
    if disk_names and offload_dir is None and offload_index is None:
        raise DeviceMapError(
            f"device_map puts {len(disk_names)} tensors on 'disk' (e.g. {sorted(disk_names)[0]}) "
            "but no offload_dir or offload_index was given; pass offload_dir=FOLDER."
        )
    if disk_names and offload_index is None and not _has_index(offload_dir):
        on_meta = [n for n in disk_names if model_state[n].device.type == "meta"]
        if on_meta:
            raise _meta_error(on_meta, f"mapped to 'disk' with no index in {offload_dir}")
        offload_state_dict(offload_dir, {n: model_state[n].detach() for n in disk_names})

    save_folder = offload_dir if disk_names else None
    weights_map = None
    if state_dict is not None or save_folder is not None or offload_index is not None:
        weights_map = OffloadedWeightsLoader(
            state_dict=state_dict, save_folder=save_folder, index=offload_index
        )
    _check_meta(model, placement, offloaded, weights_map)

    tied_params_map: TiedParamsMap = {}
    for group in tied_parameter_groups(model):
        tied_params_map[tie_key(model.get_parameter(group[0]))] = {}
    execution_device = {
        name: main if device in ("cpu", "disk") else device for name, device in device_map.items()
    }
    execution_device[""] = main
    offload = {name: device in offloaded for name, device in device_map.items()}
    for owner in uncovered_owners(placement, device_map):
        # Non-persistent buffers no key names (rotary inv_freq): their module runs on main.
        execution_device[owner], offload[owner] = main, False
    attach_align_device_hook_on_blocks(
        model,
        execution_device=execution_device,
        offload=offload,
        weights_map=weights_map,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
        tied_params_map=tied_params_map,
    )
    if prefetch:
        enable_prefetch(model)
    kinds = sorted({str(d) for d in device_map.values() if d in ("cpu", "disk")})
    if kinds:
        logger.info(
            "dispatch_model: %s blocks are offloaded; they run on %s", "/".join(kinds), main
        )


def _check_meta(
    model: nn.Module,
    placement: dict[str, int | str],
    offloaded: set[str],
    weights_map: Mapping[str, Tensor] | None,
) -> None:
    """Every tensor must have data: on its device, or in the offload source."""
    missing = []
    non_persistent = non_persistent_buffer_names(model)
    for name, tensor in _named_tensors(model):
        device = placement[name]
        if device in offloaded and name not in non_persistent:
            served = weights_map is not None and name in weights_map
            if not served and tensor.device.type == "meta":
                missing.append(name)
        elif tensor.device.type == "meta" and device != "meta":
            missing.append(name)
    if missing:
        raise _meta_error(missing, "with no offloaded copy")


def cpu_offload(
    model: nn.Module,
    execution_device: DeviceValue | None = None,
    offload_buffers: bool = False,
    state_dict: Mapping[str, Tensor] | None = None,
    preload_module_classes: list[str] | None = None,
    *,
    prefetch: bool = False,
) -> nn.Module:
    """Keep one copy of the weights on CPU; bring each module's to ``execution_device`` per forward.

    On a CPU execution device the CPU copies are used in place (zero copy), so the cost is a
    few dict assignments per module and forward.

    Args:
        model: the model (weights loaded).
        execution_device: where forwards run; default: the device of the first parameter.
        offload_buffers: offload buffers too.
        state_dict: the CPU copies (default: the model's state dict moved to CPU).
        preload_module_classes: class names loaded whole at the start of their forward.
        prefetch: keyword-only extra; copy the next module's weights while the current one
            computes (CUDA side stream from pinned memory; see ``prefetch.py``).

    Returns:
        The model.

    Example:
        >>> import torch
        >>> model = cpu_offload(torch.nn.Sequential(torch.nn.Linear(2, 2)), "cpu")
        >>> model[0].weight.device
        device(type='meta')
    """
    if execution_device is None:
        execution_device = next(iter(model.parameters())).device
    if state_dict is None:
        state_dict = {name: t.detach().to("cpu") for name, t in model.state_dict().items()}
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(
        model,
        execution_device=execution_device,
        offload=True,
        offload_buffers=offload_buffers,
        weights_map=state_dict,
        preload_module_classes=preload_module_classes,
    )
    if prefetch:
        enable_prefetch(model)
    return model


def disk_offload(
    model: nn.Module,
    offload_dir: str | os.PathLike[str],
    execution_device: DeviceValue | None = None,
    offload_buffers: bool = False,
    preload_module_classes: list[str] | None = None,
    *,
    prefetch: bool = False,
) -> nn.Module:
    """Serve every weight from memory-mapped files in ``offload_dir``, per forward.

    The model's state dict is written there first unless the folder already has an
    ``index.json`` (then the weights are used from there). On a CPU execution device weights of
    the right dtype are used in place from the memory map.

    Args:
        model: the model.
        offload_dir: the offload folder.
        execution_device: where forwards run; default: the device of the first parameter.
        offload_buffers: offload buffers too.
        preload_module_classes: class names loaded whole at the start of their forward.
        prefetch: keyword-only extra; read the next modules' weights while the current one
            computes (on CPU a background reader maps them and reads their pages in; on CUDA
            a side stream copies them; see ``prefetch.py``).

    Returns:
        The model.

    Raises:
        CheckpointError: the folder has no index and the model has tensors on ``meta``.

    Example:
        >>> import torch
        >>> model = disk_offload(torch.nn.Linear(2, 2), "offload")  # doctest: +SKIP
    """
    if not _has_index(offload_dir):
        state = model.state_dict()
        on_meta = [name for name, tensor in state.items() if tensor.device.type == "meta"]
        if on_meta:
            raise _meta_error(on_meta, f"to offload to {offload_dir}")
        offload_state_dict(offload_dir, state)
    if execution_device is None:
        execution_device = next(iter(model.parameters())).device
        if execution_device.type == "meta":
            execution_device = torch.device("cpu")
    weights_map = OffloadedWeightsLoader(save_folder=offload_dir)
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(
        model,
        execution_device=execution_device,
        offload=True,
        offload_buffers=offload_buffers,
        weights_map=weights_map,
        preload_module_classes=preload_module_classes,
    )
    if prefetch:
        enable_prefetch(model)
    return model
