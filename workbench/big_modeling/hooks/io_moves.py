"""Moving nested inputs and outputs (tensors in tuples, lists, dicts, dataclasses) to a device.

The hooks call these once per forward, so the common case — a flat tuple of plain tensors that
are already on the device, or of values that cannot hold one (None, numbers, strings, dtypes) —
returns the very same tuple after one type (and device) check each.

Example:
    >>> import torch
    >>> send_to_device({"x": torch.ones(1)}, torch.device("cpu"))
    {'x': tensor([1.])}
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

# Values that never hold a tensor: returned as they are without an isinstance chain.
_ATOMIC = frozenset(
    (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)
)
_NO_SKIP: frozenset[str] = frozenset()


def _skip_set(skip_keys: str | list[str] | tuple[str, ...] | None) -> frozenset[str]:
    if skip_keys is None:
        return _NO_SKIP
    if isinstance(skip_keys, str):
        return frozenset((skip_keys,))
    return frozenset(skip_keys)


def send_to_device(
    obj: Any,
    device: torch.device,
    non_blocking: bool = False,
    skip_keys: str | list[str] | tuple[str, ...] | frozenset[str] | None = None,
) -> Any:
    """Return ``obj`` with every tensor inside moved to ``device``.

    Tuples (named ones too), lists, mappings (including transformers' ``ModelOutput``),
    dataclasses and objects with a ``to`` method (``BatchEncoding``) are rebuilt with their own
    type; tensors already on ``device`` are kept as they are, and everything else is returned
    unchanged. Mapping values under a key in ``skip_keys`` are not moved (at any depth).

    Args:
        obj: a tensor or a nested structure.
        device: the target device.
        non_blocking: passed to ``Tensor.to``.
        skip_keys: mapping keys whose values are left where they are.

    Returns:
        The moved structure.

    Example:
        >>> import torch
        >>> send_to_device((torch.ones(1), "text"), torch.device("cpu"))
        (tensor([1.]), 'text')
    """
    skip = skip_keys if isinstance(skip_keys, frozenset) else _skip_set(skip_keys)
    return _send(obj, device, non_blocking, skip)


def _send(obj: Any, device: torch.device, non_blocking: bool, skip: frozenset[str]) -> Any:
    if obj.__class__ in _ATOMIC:
        return obj
    if isinstance(obj, Tensor):
        if obj.device == device:
            return obj
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, (tuple, list)):
        moved = [_send(item, device, non_blocking, skip) for item in obj]
        if type(obj) in (tuple, list):
            return type(obj)(moved)
        if hasattr(obj, "_fields"):  # namedtuple
            return type(obj)(*moved)
        return type(obj)(moved)
    if isinstance(obj, Mapping):
        moved = {
            key: value if key in skip else _send(value, device, non_blocking, skip)
            for key, value in obj.items()
        }
        if type(obj) is dict:
            return moved
        if dataclasses.is_dataclass(obj):  # transformers' ModelOutput: a dataclass and a dict
            return type(obj)(**moved)
        try:
            return type(obj)(moved)
        except TypeError:
            return moved
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {
            field.name: _send(getattr(obj, field.name), device, non_blocking, skip)
            for field in dataclasses.fields(obj)
            if field.name not in skip
        }
        return dataclasses.replace(obj, **changes) if _all_init(obj) else _copy_with(obj, changes)
    if not isinstance(obj, nn.Module) and callable(getattr(obj, "to", None)):
        try:
            return obj.to(device)
        except (TypeError, RuntimeError):
            return obj
    return obj


def _all_init(obj: Any) -> bool:
    return all(field.init for field in dataclasses.fields(obj))


def _copy_with(obj: Any, changes: dict[str, Any]) -> Any:
    clone = copy.copy(obj)
    for name, value in changes.items():
        object.__setattr__(clone, name, value)
    return clone


def move_args(args: tuple, device: torch.device, non_blocking: bool) -> tuple:
    """``args`` on ``device``: the same tuple when nothing in it has to move."""
    for item in args:
        cls = item.__class__
        if cls is Tensor:
            if item.device == device:
                continue
        elif cls in _ATOMIC:
            continue
        return tuple(_send(value, device, non_blocking, _NO_SKIP) for value in args)
    return args


def move_kwargs(
    kwargs: dict[str, Any], device: torch.device, non_blocking: bool, skip: frozenset[str]
) -> dict[str, Any]:
    """``kwargs`` on ``device``, honouring ``skip``; the same dict when nothing moves."""
    for key, value in kwargs.items():
        cls = value.__class__
        if cls is Tensor:
            if value.device == device:
                continue
        elif cls in _ATOMIC:
            continue
        if key in skip:
            continue
        return {
            key: value if key in skip else _send(value, device, non_blocking, skip)
            for key, value in kwargs.items()
        }
    return kwargs


def find_device(obj: Any) -> torch.device | None:
    """The device of the first tensor found in a nested structure, or ``None``.

    Example:
        >>> import torch
        >>> find_device([1, {"x": torch.ones(1)}])
        device(type='cpu')
    """
    if isinstance(obj, Tensor):
        return obj.device
    if isinstance(obj, Mapping):
        values = obj.values()
    elif isinstance(obj, (tuple, list)):
        values = obj
    else:
        return None
    for value in values:
        device = find_device(value)
        if device is not None:
            return device
    return None


def with_row_major_strides(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with each contiguous tensor argument of unusual strides given the row-major
    strides of its shape (a view of the same bytes: no copy).

    A contiguous tensor may carry any stride on a dimension of size 1, and ``torch.matmul``
    (torch 2.13, CPU, 16-bit weights) then declines to fold a 3-D input into one matrix
    product unless the weight is a ``requires_grad`` tensor made outside inference mode, which
    an offloaded module's onloaded weight is not: it broadcasts the weight into a batched
    product and copies all of it. A causal LM's output layer gets such an input in every
    prefill (``hidden[:, -1:, :]``: strides ``(T * H, H, 1)``): SmolLM2-135M's 54 MiB head
    weight was copied per prefill with the head on disk (an all-disk run measured 60 MiB of
    CPU memory where 7 were predicted; 7.6 now).

    Example:
        >>> import torch
        >>> last = torch.zeros(1, 8, 4)[:, -1:, :]
        >>> last.stride(), with_row_major_strides((last,))[0].stride()
        ((32, 4, 1), (4, 4, 1))
    """
    for arg in args:  # a plain loop: this runs in every offloaded forward
        if isinstance(arg, Tensor) and arg.dim() >= 3:
            return tuple(_row_major(a) if isinstance(a, Tensor) else a for a in args)
    return args


def _row_major(tensor: Tensor) -> Tensor:
    if tensor.dim() < 3 or tensor.layout != torch.strided or not tensor.is_contiguous():
        return tensor
    strides, step = [], 1
    for size in reversed(tensor.shape):
        strides.append(step)
        step *= max(size, 1)
    row_major = tuple(reversed(strides))
    if tensor.stride() == row_major:
        return tensor
    return tensor.as_strided(tensor.shape, row_major, tensor.storage_offset())
