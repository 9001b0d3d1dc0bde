"""Where a module's tensors live, and the cheap swaps the device hooks make on them.

A ``TensorSlot`` is one parameter or buffer entry of one (sub)module: the owner, its attribute
name, a ``meta`` placeholder made once at attach time, and what it takes to bring the stored
value onto the execution device. Swapping a slot is one dict assignment into the owner's
``_parameters``/``_buffers``; nothing is recomputed per forward.

Tied weights: ``tied_params_map`` maps a *tie key* (the data pointer of the tied tensor, or
``id`` of a ``meta`` tensor, whose data pointer is always 0) to ``{torch.device: tensor}`` so a
tied weight is materialised once per execution device.

Example:
    >>> import torch
    >>> [name for name, *_ in named_module_tensors(torch.nn.Linear(2, 2))]
    ['weight', 'bias']
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import Parameter

from workbench.big_modeling.dtypes import lookup_dtype
from workbench.big_modeling.errors import CheckpointError

TiedParamsMap = dict[int, dict[Any, Tensor]]

_META = torch.device("meta")


def tie_key(tensor: Tensor) -> int:
    """The key of ``tensor`` in a ``tied_params_map`` (data pointer; ``id`` on ``meta``)."""
    if tensor.device.type == "meta":
        return id(tensor)
    return tensor.data_ptr()


def named_module_tensors(
    module: nn.Module,
    include_buffers: bool = True,
    recurse: bool = False,
    remove_non_persistent: bool = False,
) -> list[tuple[str, nn.Module, str, bool, Tensor]]:
    """List ``(name, owner, attribute, is_param, tensor)`` for the tensors of ``module``.

    Args:
        module: the module.
        include_buffers: also list buffers.
        recurse: also list the tensors of submodules (names are dotted, relative to ``module``).
        remove_non_persistent: skip buffers registered with ``persistent=False``.

    Returns:
        The entries, parameters of each owner before its buffers.
    """
    owners = module.named_modules(remove_duplicate=False) if recurse else [("", module)]
    entries: list[tuple[str, nn.Module, str, bool, Tensor]] = []
    seen: set[tuple[int, str]] = set()
    for prefix, owner in owners:
        if (id(owner), prefix) in seen:
            continue
        seen.add((id(owner), prefix))
        dotted = f"{prefix}." if prefix else ""
        for attr, param in owner._parameters.items():
            if param is not None:
                entries.append((dotted + attr, owner, attr, True, param))
        if not include_buffers:
            continue
        non_persistent = owner._non_persistent_buffers_set
        for attr, buffer in owner._buffers.items():
            if buffer is None or (remove_non_persistent and attr in non_persistent):
                continue
            entries.append((dotted + attr, owner, attr, False, buffer))
    return entries


def non_persistent_buffers(
    module: nn.Module, recurse: bool = False
) -> list[tuple[str, nn.Module, str, Tensor]]:
    """List ``(name, owner, attribute, tensor)`` for the non-persistent buffers of ``module``."""
    return [
        (name, owner, attr, tensor)
        for name, owner, attr, is_param, tensor in named_module_tensors(module, recurse=recurse)
        if not is_param and attr in owner._non_persistent_buffers_set
    ]


def set_slot(owner: nn.Module, attr: str, is_param: bool, value: Tensor) -> None:
    """Put ``value`` in ``owner``'s parameter or buffer entry ``attr`` (no checks: hot path)."""
    if is_param:
        owner._parameters[attr] = value
    else:
        owner._buffers[attr] = value


def as_parameter(value: Tensor, requires_grad: bool) -> Parameter:
    """``value`` as a ``Parameter`` sharing its storage (the same object when it already is)."""
    if isinstance(value, Parameter) and value.requires_grad == requires_grad:
        return value
    return Parameter(value, requires_grad=requires_grad and value.is_floating_point())


def place_tensor(
    owner: nn.Module,
    attr: str,
    is_param: bool,
    tensor: Tensor,
    device: torch.device,
    tied_params_map: TiedParamsMap | None,
    *,
    key: int | None = None,
) -> Tensor:
    """Move one entry to ``device`` for good, reusing a tied copy already there.

    Returns:
        The tensor now in the entry.
    """
    per_device = None
    if tied_params_map is not None:
        per_device = tied_params_map.get(tie_key(tensor) if key is None else key)
        if per_device is not None and device in per_device:
            value = per_device[device]
            set_slot(owner, attr, is_param, value)
            return value
    value = tensor if tensor.device == device else tensor.to(device)
    if is_param:
        value = as_parameter(value, tensor.requires_grad)
    if per_device is not None:
        per_device[device] = value
    set_slot(owner, attr, is_param, value)
    return value


class TensorSlot:
    """One offloaded entry: swapped between a ``meta`` placeholder and its materialised value.

    ``stable`` marks sources that return the same tensor object every time (an in-memory state
    dict); for them a zero-copy materialisation (same device and dtype) is cached, so a CPU
    execution device costs one dict assignment per tensor and forward.
    """

    __slots__ = (
        "attr",
        "cached_source",
        "cached_value",
        "dtype",
        "is_param",
        "key",
        "mapping",
        "name",
        "nbytes",
        "owner",
        "placeholder",
        "requires_grad",
        "source",
        "stable",
        "tensor_nbytes",
        "tie",
    )

    def __init__(
        self,
        name: str,
        owner: nn.Module,
        attr: str,
        is_param: bool,
        tensor: Tensor,
        *,
        tie: int | None,
    ) -> None:
        self.name, self.owner, self.attr, self.is_param = name, owner, attr, is_param
        self.dtype = tensor.dtype
        self.requires_grad = bool(tensor.requires_grad)
        self.tensor_nbytes = held_nbytes(tensor)
        self.nbytes = self.tensor_nbytes
        meta = tensor.detach().to(_META) if tensor.device != _META else tensor.detach()
        self.placeholder = as_parameter(meta, self.requires_grad) if is_param else meta
        self.tie = tie
        self.source, self.stable = "cpu", False
        self.cached_source: Tensor | None = None
        self.cached_value: Tensor | None = None
        self.mapping: Mapping[str, Tensor] = {}
        self.key = name

    def resolve(self, weights_map: Mapping[str, Tensor]) -> None:
        """Read this slot's stored value straight from the mapping under any prefixed views.

        ``nbytes`` becomes what a materialisation reads from there: a disk entry's stored bytes
        (a quantized weight's packed tensors), not the placeholder's dtype x shape.
        """
        self.mapping, self.key = unwrap_prefixed(weights_map, self.name)
        self.source, self.stable = describe_source(weights_map, self.name)
        self.cached_source = self.cached_value = None
        stored = stored_nbytes_in(self.mapping, self.key)
        self.nbytes = self.tensor_nbytes if stored is None else stored

    def materialize(
        self, stored: Tensor, device: torch.device | None, non_blocking: bool
    ) -> Tensor:
        """The value to put in the entry for a forward on ``device``, from the stored tensor."""
        if stored is self.cached_source:
            return self.cached_value  # type: ignore[return-value]
        if (device is None or stored.device == device) and stored.dtype == self.dtype:
            value = as_parameter(stored, self.requires_grad) if self.is_param else stored
            if self.stable and stored.device.type == "cpu":  # never pin accelerator memory
                self.cached_source, self.cached_value = stored, value
            return value
        if stored.shape != self.placeholder.shape:
            raise CheckpointError(
                f"offloaded tensor {self.name!r} has shape {list(stored.shape)}, but the module "
                f"expects {list(self.placeholder.shape)}; offload the weights of this model again."
            )
        value = stored.to(device=device, dtype=self.dtype, non_blocking=non_blocking)
        return as_parameter(value, self.requires_grad) if self.is_param else value

    def offload(self) -> None:
        set_slot(self.owner, self.attr, self.is_param, self.placeholder)

    def __repr__(self) -> str:
        return f"TensorSlot({self.name!r}, {self.nbytes} B from {self.source})"


def unwrap_prefixed(
    weights_map: Mapping[str, Tensor], name: str
) -> tuple[Mapping[str, Tensor], str]:
    """The mapping under ``PrefixedDataset`` views of ``weights_map`` and ``name``'s key in it."""
    mapping, key = weights_map, name
    while hasattr(mapping, "dataset") and hasattr(mapping, "prefix"):
        mapping, key = mapping.dataset, f"{mapping.prefix}{key}"
    return mapping, key


def describe_source(weights_map: Mapping[str, Tensor], name: str) -> tuple[str, bool]:
    """Where ``weights_map[name]`` is read from (``"disk"``, ``"cpu"``...) and whether it is stable.

    Looks through ``PrefixedDataset`` views and ``OffloadedWeightsLoader`` (its in-memory
    ``state_dict`` versus its on-disk ``index``) without reading offloaded data.
    """
    mapping, key = unwrap_prefixed(weights_map, name)
    if hasattr(mapping, "index") and hasattr(mapping, "state_dict"):
        if key in mapping.state_dict:
            return _label(mapping.state_dict[key]), True
        return "disk", False
    if isinstance(mapping, dict):
        value = mapping.get(key)
        return (_label(value), True) if isinstance(value, Tensor) else ("cpu", False)
    return "cpu", False


def held_nbytes(tensor: Tensor) -> int:
    """Bytes of a tensor's data; for a wrapper subclass (a torchao packed weight, which reports
    its unquantized dtype and shape), the sum over its inner tensors.

    Example:
        >>> held_nbytes(torch.zeros(4, 4, dtype=torch.bfloat16))
        32
    """
    if hasattr(type(tensor), "__tensor_flatten__"):
        names, _attributes = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
        return sum(held_nbytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()


def stored_nbytes_in(mapping: Mapping[str, Any], key: str) -> int | None:
    """Bytes ``mapping[key]`` holds where it is stored, without reading it; ``None`` if unknown.

    An in-memory value counts its data (``held_nbytes``). An offload-folder entry counts its
    index record's dtype x shape, and a ``"torchao"`` record the sum of its packed inner
    entries (the bytes a hook reads from the ``*.quantized-*.safetensors`` file).
    """
    state_dict = getattr(mapping, "state_dict", None)
    index = getattr(mapping, "index", None)
    if isinstance(state_dict, Mapping) and isinstance(index, Mapping):
        value = state_dict.get(key)
        return held_nbytes(value) if isinstance(value, Tensor) else _entry_nbytes(index, key)
    if isinstance(mapping, dict):
        value = mapping.get(key)
        return held_nbytes(value) if isinstance(value, Tensor) else None
    return None


def _entry_nbytes(index: Mapping[str, Any], key: str) -> int | None:
    info = index.get(key)
    if not isinstance(info, Mapping):
        return None
    record = info.get("torchao")
    if isinstance(record, Mapping):
        inner = record.get("tensors")
        parts = [_entry_nbytes(index, name) for name in (inner or {}).values()]
        return sum(parts) if parts and None not in parts else None  # type: ignore[arg-type]
    dtype, shape = lookup_dtype(info.get("dtype")), info.get("shape")
    if dtype is None or not isinstance(shape, (list, tuple)):
        return None
    return math.prod(int(size) for size in shape) * dtype.itemsize


def _label(tensor: Tensor) -> str:
    device = tensor.device
    if device.type == "cuda":
        return f"cuda:{device.index or 0}"
    return str(device)
