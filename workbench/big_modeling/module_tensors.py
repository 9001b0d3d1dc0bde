"""The reference's tensor-level utilities: set one tensor, list tensors, retie, tie-aware sizes.

These are the helpers that code written for the reference calls next to the big-model API
(``accelerate.utils.modeling``); they keep its names, signatures and results.

Example:
    >>> import torch
    >>> model = torch.nn.Linear(2, 2)
    >>> set_module_tensor_to_device(model, "weight", "meta")
    >>> model.weight.device
    device(type='meta')
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn

from workbench.big_modeling.devices import DeviceValue, to_torch_device
from workbench.big_modeling.hooks.tensor_slots import TiedParamsMap
from workbench.big_modeling.planning.dtype_sizes import as_dtype

__all__ = [
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "named_module_tensors",
    "retie_parameters",
    "set_module_tensor_to_device",
]

_KEEP_DTYPE = ("torch.uint", "torch.int", "torch.bool")  # never cast to a requested dtype


def _owner(module: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    """The submodule holding ``tensor_name`` (dotted) and the tensor's attribute name."""
    *path, attr = tensor_name.split(".")
    owner = module
    for part in path:
        child = getattr(owner, part, None)
        if not isinstance(child, nn.Module):
            raise ValueError(f"{type(owner).__name__} has no submodule {part!r} ({tensor_name}).")
        owner = child
    if attr not in owner._parameters and attr not in owner._buffers:
        raise ValueError(f"{owner} does not have a parameter or a buffer named {attr}.")
    return owner, attr


def _device_key(device: DeviceValue) -> torch.device:
    return to_torch_device(device) if not isinstance(device, torch.device) else device


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: DeviceValue,
    value: Tensor | None = None,
    dtype: str | torch.dtype | None = None,
    fp16_statistics: Tensor | None = None,
    tied_params_map: TiedParamsMap | None = None,
    non_blocking: bool = False,
    clear_cache: bool = True,
) -> None:
    """Put one parameter or buffer of ``module`` on ``device`` (optionally with a new ``value``).

    ``param.to(device)`` makes a new tensor the module does not see; this replaces the entry
    itself, keeping the parameter's class and ``requires_grad``.

    Args:
        module: the module (or an ancestor of the tensor's owner).
        tensor_name: the tensor's name relative to ``module`` (``"linear1.weight"``).
        device: an int, ``"cpu"``, ``"cuda:1"``, ``"meta"`` or a ``torch.device``.
        value: the new data (needed to leave ``meta``); same shape as the current tensor.
        dtype: cast floating values to it; default: the current tensor's dtype.
        fp16_statistics: stored as the parameter's ``SCB`` (8-bit serialisation).
        tied_params_map: data pointer -> {device: tensor}; a tied weight already on ``device``
            is reused instead of copied, and the new tensor is recorded.
        non_blocking: asynchronous host-to-device copies where possible.
        clear_cache: empty the accelerator's cache afterwards (not on cpu/meta).

    Raises:
        ValueError: no such tensor; a ``meta`` tensor without ``value``; ``value`` of another
            shape.

    Example:
        >>> import torch
        >>> layer = torch.nn.Linear(2, 2, device="meta")
        >>> set_module_tensor_to_device(layer, "bias", "cpu", value=torch.zeros(2))
        >>> layer.bias
        Parameter containing:
        tensor([0., 0.], requires_grad=True)
    """
    owner, attr = _owner(module, tensor_name)
    is_buffer = attr in owner._buffers
    old = owner._buffers[attr] if is_buffer else owner._parameters[attr]
    target = _device_key(device)
    if tied_params_map is not None:
        for source in (value, old):
            if source is None:
                continue
            tied = tied_params_map.get(source.data_ptr())
            if tied is not None and target in tied:
                _store(owner, attr, is_buffer, tied[target])
                return
    if old.device.type == "meta" and target.type != "meta" and value is None:
        raise ValueError(
            f"{tensor_name} is on the meta device, we need a `value` to put in on {device}."
        )
    if value is not None:
        if old.shape != value.shape and type(old).__name__ != "Params4bit":
            raise ValueError(
                f'Trying to set a tensor of shape {value.shape} in "{attr}" (which has shape '
                f"{old.shape}), this looks incorrect."
            )
        if dtype is None:
            value = value.to(old.dtype, non_blocking=non_blocking)
        elif not str(value.dtype).startswith(_KEEP_DTYPE):
            value = value.to(as_dtype(dtype), non_blocking=non_blocking)
    with torch.no_grad():
        if value is None:
            new = old.to(target, non_blocking=non_blocking)
            if (
                dtype is not None
                and target.type == "meta"
                and not str(old.dtype).startswith(_KEEP_DTYPE)
            ):
                new = new.to(as_dtype(dtype))
        else:
            new = value.to(target, non_blocking=non_blocking)
        if not is_buffer:
            param_class = type(old) if isinstance(old, nn.Parameter) else nn.Parameter
            extras = {k: v for k, v in old.__dict__.items() if k == "_is_hf_initialized"}
            requires_grad = old.requires_grad and new.is_floating_point()
            if not (isinstance(new, param_class) and new.requires_grad == requires_grad):
                new = param_class(new, requires_grad=requires_grad)
            new.__dict__.update(extras)
            if fp16_statistics is not None:
                new.SCB = fp16_statistics.to(target, non_blocking=non_blocking)
        _store(owner, attr, is_buffer, new)
    if clear_cache and target.type == "cuda":
        torch.cuda.empty_cache()
    if tied_params_map is not None:
        for source in (old, value):
            tied = None if source is None else tied_params_map.get(source.data_ptr())
            if tied is not None:
                tied.setdefault(target, new)
                break


def _store(owner: nn.Module, attr: str, is_buffer: bool, tensor: Tensor) -> None:
    if is_buffer:
        owner._buffers[attr] = tensor
    else:
        owner._parameters[attr] = tensor


def get_non_persistent_buffers(
    module: nn.Module, recurse: bool = False, fqns: bool = False
) -> set[str]:
    """Names of the buffers of ``module`` registered with ``persistent=False`` (a new set).

    Args:
        module: the module.
        recurse: include the submodules' (their attribute names, or full names with ``fqns``).
        fqns: with ``recurse``, name submodule buffers by their dotted names.

    Returns:
        A copy; the module's private sets are never changed.

    Example:
        >>> import torch
        >>> layer = torch.nn.Linear(2, 2)
        >>> layer.register_buffer("scratch", torch.zeros(1), persistent=False)
        >>> get_non_persistent_buffers(layer)
        {'scratch'}
    """
    names = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, sub in module.named_modules():
            if fqns and prefix:
                names.update(f"{prefix}.{attr}" for attr in sub._non_persistent_buffers_set)
            else:
                names.update(sub._non_persistent_buffers_set)
    return names


def named_module_tensors(
    module: nn.Module,
    include_buffers: bool = True,
    recurse: bool = False,
    remove_non_persistent: bool = False,
) -> Iterator[tuple[str, Tensor]]:
    """Yield ``(name, tensor)``: the parameters, then (with ``include_buffers``) the buffers.

    The same as ``named_parameters(recurse=recurse)`` followed by ``named_buffers(...)``.

    Args:
        module: the module.
        include_buffers: also yield buffers.
        recurse: also yield the submodules' tensors (dotted names).
        remove_non_persistent: skip buffers registered with ``persistent=False`` (matched by
            full name, so with ``recurse`` the submodules' are skipped too).

    Example:
        >>> import torch
        >>> [name for name, _ in named_module_tensors(torch.nn.BatchNorm1d(2))]
        ['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked']
    """
    yield from module.named_parameters(recurse=recurse)
    if not include_buffers:
        return
    skipped: set[str] = set()
    if remove_non_persistent:
        # Full names: a submodule's non-persistent "mask" never hides the root's own "mask".
        skipped = get_non_persistent_buffers(module, recurse=recurse, fqns=True)
    for name, buffer in module.named_buffers(recurse=recurse):
        if name not in skipped:
            yield name, buffer


def retie_parameters(model: nn.Module, tied_params: Sequence[Sequence[str]]) -> None:
    """Tie again the groups of ``find_tied_parameters`` (hooks may have untied them).

    Each group gets the first of its parameters that is not on ``meta``; a group all on
    ``meta`` is left as it is.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        >>> retie_parameters(model, [["0.weight", "1.weight"]])
        >>> model[0].weight is model[1].weight
        True
    """
    for group in tied_params:
        slots = [_owner(model, name) for name in group]
        kept = next(
            (
                owner._parameters[attr]
                for owner, attr in slots
                if owner._parameters[attr].device.type != "meta"
            ),
            None,
        )
        if kept is not None:
            for owner, attr in slots:
                setattr(owner, attr, kept)


def get_module_size_with_ties(
    tied_params: Sequence[str],
    module_size: int,
    module_sizes: dict[str, int],
    modules_to_treat: Sequence[tuple[str, nn.Module]],
) -> tuple[int, list[str], list[nn.Module]]:
    """The size of a module plus the modules its tied parameters pull onto the same device.

    Args:
        tied_params: names of the parameters tied to the module's, outside it.
        module_size: the module's own size in bytes.
        module_sizes: name -> bytes (``compute_module_sizes``).
        modules_to_treat: ``(name, module)`` still to place; each tied parameter belongs to one.

    Returns:
        ``(bytes, tied module names, tied modules)``; a tied parameter counts once (its module's
        size less the parameter itself). ``"a.1"`` never matches ``"a.10.weight"``.

    Example:
        >>> get_module_size_with_ties([], 80, {}, [])
        (80, [], [])
    """
    if not tied_params:
        return module_size, [], []
    names: list[str] = []
    modules: list[nn.Module] = []
    for param in tied_params:
        name, module = next((n, m) for n, m in modules_to_treat if param.startswith(n + "."))
        names.append(name)
        modules.append(module)
    total = module_size
    for param, name in zip(tied_params, names, strict=True):
        total += module_sizes[name] - module_sizes[param]
    return total, names, modules
