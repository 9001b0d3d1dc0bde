"""The reference's state-dict utilities: read one checkpoint file, pick submodules' entries, and
gather the full state dict of an offloaded model.

Example:
    >>> import torch
    >>> extract_submodules_state_dict({"a.1.w": torch.ones(1), "a.10.w": torch.ones(1)}, ["a.1"])
    {'a.1.w': tensor([1.])}
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from workbench.big_modeling.device_map.value import covering_key
from workbench.big_modeling.devices import DeviceValue, normalize_device, to_torch_device
from workbench.big_modeling.hooks.align import align_module_device
from workbench.big_modeling.loading.index import CheckpointIndex
from workbench.big_modeling.loading.pickled import load_pickled_state_dict
from workbench.big_modeling.loading.reader import TensorReader

__all__ = [
    "extract_submodules_state_dict",
    "get_state_dict_offloaded_model",
    "load_state_dict",
]

logger = logging.getLogger(__name__)


def _covered(name: str, prefix: str) -> bool:
    return not prefix or name == prefix or name.startswith(prefix + ".")


def extract_submodules_state_dict(
    state_dict: Mapping[str, Tensor], submodule_names: Sequence[str]
) -> dict[str, Tensor]:
    """The entries of ``state_dict`` that belong to one of ``submodule_names``.

    A name covers itself and its dotted descendants: ``"a.1"`` takes ``"a.1.weight"`` but not
    ``"a.10.weight"``.

    Example:
        >>> import torch
        >>> sorted(extract_submodules_state_dict({"a.w": torch.ones(1), "b.w": torch.ones(1)}, ["b"]))
        ['b.w']
    """
    return {
        key: tensor
        for key, tensor in state_dict.items()
        if any(_covered(key, name) for name in submodule_names)
    }


def _device_of(name: str, device_map: Mapping[str, DeviceValue]) -> torch.device:
    """The most specific key of ``device_map`` covering ``name``; ``"disk"`` and none: CPU."""
    key = covering_key(name, device_map)
    if key is None:
        return torch.device("cpu")
    device = normalize_device(device_map[key])
    return torch.device("cpu") if device == "disk" else to_torch_device(device)


def load_state_dict(
    checkpoint_file: str | os.PathLike[str],
    device_map: Mapping[str, DeviceValue] | None = None,
) -> dict[str, Tensor]:
    """Read a whole checkpoint file: safetensors, or a weights-only torch pickle.

    Args:
        checkpoint_file: a ``.safetensors`` file, or a ``torch.save`` file of plain tensors.
        device_map: module name -> device; safetensors entries are read, then moved to their
            device (``"disk"`` and uncovered entries onto the CPU). Pickles always load on CPU.

    Returns:
        Name -> tensor.

    Raises:
        CheckpointError: a truncated or malformed safetensors header, or a pickle that is not
            weights-only.

    Example:
        >>> load_state_dict("model.safetensors", device_map={"": "cpu"})  # doctest: +SKIP
    """
    path = os.fspath(checkpoint_file)
    if not path.endswith(".safetensors"):
        return load_pickled_state_dict(path)
    index = CheckpointIndex.from_path(path)  # clear errors for malformed files
    tensors: dict[str, Tensor] = {}
    with TensorReader(index) as reader:
        for name, info in index.tensors.items():
            device = _device_of(name, device_map) if device_map else torch.device("cpu")
            tensor = reader.read(info)
            tensors[name] = tensor if device.type == "cpu" else tensor.to(device)
    return tensors


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, Tensor]:
    """The full state dict of a model dispatched with CPU or disk offload, on the CPU.

    Each offloaded module's weights are brought in (``align_module_device(module, "cpu")``) one
    module at a time, so only one module's weights are materialised at once.

    Returns:
        The same keys as ``model.state_dict()`` before offloading, CPU tensors equal to them;
        tensors that are on ``meta`` with no offloaded copy are left out (logged).

    Example:
        >>> import torch
        >>> from workbench.big_modeling import cpu_offload
        >>> model = cpu_offload(torch.nn.Linear(2, 2), "cpu")
        >>> sorted(get_state_dict_offloaded_model(model))
        ['bias', 'weight']
    """
    state_dict: dict[str, Tensor] = {}
    on_meta: list[str] = []
    for prefix, module in model.named_modules(remove_duplicate=False):
        dotted = f"{prefix}." if prefix else ""
        with align_module_device(module, "cpu"):
            for attr, tensor in _direct_state(module).items():
                name = dotted + attr
                if tensor.device.type == "meta":
                    on_meta.append(name)
                else:
                    state_dict[name] = tensor.detach().to("cpu")
    missing = sorted(name for name in on_meta if name not in state_dict)
    if missing:
        logger.warning(
            "get_state_dict_offloaded_model: %d tensors are on the meta device with no "
            "offloaded copy and were left out: %s",
            len(missing),
            ", ".join(missing[:20]),
        )
    return {name: state_dict[name] for name in model.state_dict() if name in state_dict}


def _direct_state(module: nn.Module) -> dict[str, Tensor]:
    """The module's own persistent entries (what ``state_dict`` holds for it, no children)."""
    entries = {attr: p for attr, p in module._parameters.items() if p is not None}
    entries |= {
        attr: b
        for attr, b in module._buffers.items()
        if b is not None and attr not in module._non_persistent_buffers_set
    }
    return entries
