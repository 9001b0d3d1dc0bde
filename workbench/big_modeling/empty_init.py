"""Build models without allocating their weights: ``init_empty_weights`` and ``init_on_device``.

Inside the block, every parameter a module registers is moved to the target device (``meta`` for
``init_empty_weights``) as it is registered, so ``nn.Linear(10000, 10000)`` never keeps its
400 MB. Buffers stay real by default — a rotary ``inv_freq`` computed in ``__init__`` stays
usable — and follow the parameters with ``include_buffers=True``, in which case a
``torch.device`` context also puts every factory call (``torch.empty``, ``torch.arange``) there.

The patch is process-wide (``nn.Module.register_parameter``) for the duration of the block, as in
Accelerate; build models in one thread at a time. Everything is restored on exit, exceptions
included, and blocks nest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from workbench.big_modeling.devices import DeviceValue, to_torch_device

__all__ = ["init_empty_weights", "init_on_device"]


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool | None = None) -> Iterator[None]:
    """Build models inside this block with every parameter on the ``meta`` device.

    A model built this way costs no RAM for its weights and builds in about the time of
    ``with torch.device("meta")``. It cannot run or be ``.to()``-ed until weights are loaded
    (``load_checkpoint_and_dispatch``); sizes, the planner and the GUI's tree only need shapes.

    Args:
        include_buffers: also put buffers on ``meta``. Default ``False``: buffers such as rotary
            ``inv_freq`` keep their real values.

    Example:
        >>> with init_empty_weights():
        ...     model = nn.Sequential(*[nn.Linear(10000, 10000) for _ in range(1000)])
        >>> model[0].weight.device
        device(type='meta')
    """
    with init_on_device(torch.device("meta"), include_buffers=include_buffers):
        yield


@contextlib.contextmanager
def init_on_device(device: DeviceValue, include_buffers: bool | None = None) -> Iterator[None]:
    """Build models inside this block with every parameter on ``device``.

    Args:
        device: where parameters go: ``"meta"``, ``"cpu"``, ``0``/``"cuda:0"``, a ``torch.device``.
        include_buffers: also put buffers on ``device`` (default ``False``).

    Raises:
        DeviceMapError: for ``"disk"`` or anything that is not a device.

    Example:
        >>> with init_on_device("meta"):
        ...     layer = nn.Linear(4, 4)
        >>> layer.weight.is_meta
        True
    """
    target = device if isinstance(device, torch.device) else to_torch_device(device)
    include_buffers = bool(include_buffers)
    # Nested blocks call the unpatched methods, so the innermost device wins.
    original_register_parameter = _unwrapped(nn.Module.register_parameter)
    original_register_buffer = _unwrapped(nn.Module.register_buffer)

    def register_parameter(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original_register_parameter(self, name, param)
        if param is not None and param.device != target:
            self._parameters[name] = _moved_parameter(param, target)

    def register_buffer(
        self: nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True
    ) -> None:
        original_register_buffer(self, name, tensor, persistent=persistent)
        if tensor is not None and tensor.device != target:
            self._buffers[name] = tensor.to(target)

    register_parameter._workbench_original = original_register_parameter  # type: ignore[attr-defined]
    register_buffer._workbench_original = original_register_buffer  # type: ignore[attr-defined]
    with contextlib.ExitStack() as stack:
        if include_buffers:
            # Factory calls (torch.empty/arange in __init__) go straight to the device.
            stack.enter_context(target)
        stack.enter_context(_patched(nn.Module, "register_parameter", register_parameter))
        if include_buffers:
            stack.enter_context(_patched(nn.Module, "register_buffer", register_buffer))
        if target.type == "meta":
            for name in _INIT_FUNCTIONS:
                if hasattr(nn.init, name):
                    stack.enter_context(
                        _patched(nn.init, name, skip_on_meta(getattr(nn.init, name)))
                    )
        yield


# Random initialisation of a meta tensor computes nothing but still costs a dispatch through
# torch's decompositions (about 60% of building nn.Linear on meta); skip it for meta tensors.
_INIT_FUNCTIONS = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "constant_",
    "ones_",
    "zeros_",
    "eye_",
    "dirac_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "orthogonal_",
    "sparse_",
)


def skip_on_meta(init_function: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a ``torch.nn.init``-style function so it returns meta tensors untouched."""
    original = _unwrapped(init_function)

    def init_unless_meta(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if tensor.is_meta:
            return tensor
        return original(tensor, *args, **kwargs)

    init_unless_meta._workbench_original = original  # type: ignore[attr-defined]
    return init_unless_meta


def _unwrapped(method: Callable[..., Any]) -> Callable[..., Any]:
    return getattr(method, "_workbench_original", method)


def _moved_parameter(param: nn.Parameter, target: torch.device) -> nn.Parameter:
    """Return ``param`` moved to ``target``, keeping its class and extra attributes."""
    param_cls = type(param)
    extra: dict[str, Any] = dict(param.__dict__)
    moved = param.data.to(target)
    if param_cls is nn.Parameter:
        new = nn.Parameter(moved, requires_grad=param.requires_grad)
        new.__dict__.update(extra)
        return new
    # Parameter subclasses (quantised params) take their attributes as constructor kwargs.
    extra["requires_grad"] = param.requires_grad
    return param_cls(moved, **extra)


@contextlib.contextmanager
def _patched(owner: object, name: str, replacement: Callable[..., Any]) -> Iterator[None]:
    """Set ``owner.name = replacement`` for the block; restore the original on any exit."""
    original = vars(owner)[name]
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)
