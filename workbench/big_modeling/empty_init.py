"""Build models without allocating their weights: ``init_empty_weights`` and ``init_on_device``.

Inside the block, every parameter a module registers is moved to the target device (``meta`` for
``init_empty_weights``) as it is registered, so ``nn.Linear(10000, 10000)`` never keeps its
400 MB. Buffers stay real by default — a rotary ``inv_freq`` computed in ``__init__`` stays
usable — and follow the parameters with ``include_buffers=True``, in which case a
``torch.device`` context also puts every factory call (``torch.empty``, ``torch.arange``) there.

With ``include_buffers=True`` the block is only a ``torch.device`` context (thread-local), as the
reference does on torch >= 2.0: ``nn.Module.register_parameter``/``register_buffer`` are left
untouched. Without it, ``nn.Module.register_parameter`` is wrapped while any block is open (as
in the reference), but the wrapper acts only in the threads that opened a block, each on its own
innermost device, so a GUI or worker thread building a real model at the same time is not
affected. Everything is restored when the last block closes, exceptions included, and blocks
nest.
"""

from __future__ import annotations

import contextlib
import threading
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
    targets = _thread_targets()
    with contextlib.ExitStack() as stack:
        targets.append(target)
        stack.callback(targets.pop)
        if include_buffers:
            # The reference on torch >= 2.0: a device context (thread-local), nothing patched.
            stack.enter_context(target)
        else:
            stack.enter_context(_REGISTER_PARAMETER_PATCH.held())
        if target.type == "meta":
            stack.enter_context(_INIT_PATCH.held())
        yield


_local = threading.local()


def _thread_targets() -> list[torch.device]:
    """This thread's open blocks, innermost last."""
    targets = getattr(_local, "targets", None)
    if targets is None:
        targets = _local.targets = []
    return targets


class _SharedPatch:
    """Patches applied while at least one block (in any thread) holds them; a lock keeps two
    threads from interleaving the install and the restore."""

    def __init__(self, install: Callable[[], list[tuple[object, str, Any]]]) -> None:
        self._install = install
        self._lock = threading.Lock()
        self._holders = 0
        self._saved: list[tuple[object, str, Any]] = []

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._holders == 0:
                self._saved = self._install()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0:
                    for owner, name, original in reversed(self._saved):
                        setattr(owner, name, original)
                    self._saved = []


def _install_register_parameter() -> list[tuple[object, str, Any]]:
    original = vars(nn.Module)["register_parameter"]

    def register_parameter(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(self, name, param)
        targets = getattr(_local, "targets", None)
        if targets and param is not None and param.device != targets[-1]:
            self._parameters[name] = _moved_parameter(param, targets[-1])

    register_parameter._workbench_original = original  # type: ignore[attr-defined]
    nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
    return [(nn.Module, "register_parameter", original)]


def _install_init_skips() -> list[tuple[object, str, Any]]:
    saved = []
    for name in _INIT_FUNCTIONS:
        function = vars(nn.init).get(name)
        if function is not None:
            saved.append((nn.init, name, function))
            setattr(nn.init, name, skip_on_meta(function))
    return saved


_REGISTER_PARAMETER_PATCH = _SharedPatch(_install_register_parameter)
# Skipping init on meta tensors changes nothing for real tensors, so other threads are safe.
_INIT_PATCH = _SharedPatch(_install_init_skips)


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
