"""Hooks that run around a module's ``forward`` and, unlike PyTorch's, see its kwargs.

``add_hook_to_module`` replaces ``module.forward`` with a thin wrapper (a ``functools.partial``
carrying the original's name, docstring and signature) that calls the hook's ``pre_forward``,
the original forward (kept in ``module._old_forward``) and the hook's ``post_forward``. The
attached hook is ``module._hf_hook``: transformers and peft read both attributes.

Differences from the reference, all in the user's favour:

- Exception safety: when the forward raises, ``hook.forward_failed(module, error)`` runs
  before the error propagates, so an offloading hook puts its weights back to ``meta`` and the
  module is left as it was before the call.
- ``remove_hook_from_module`` restores the exact original: when ``forward`` was the class's
  method, the instance attribute is deleted rather than left as a bound method.
- Appending a hook does not detach and re-initialise the hooks already attached.
- Hooks have a readable ``repr``.

Example:
    >>> import torch
    >>> class Double(ModelHook):
    ...     def post_forward(self, module, output):
    ...         return output * 2
    >>> layer = add_hook_to_module(torch.nn.Identity(), Double())
    >>> layer(torch.ones(1))
    tensor([2.])
    >>> remove_hook_from_module(layer)(torch.ones(1))
    tensor([1.])
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
from torch import Tensor, nn

from workbench.big_modeling import transfers as _transfers
from workbench.big_modeling.hooks.io_moves import move_args, move_kwargs

_INSTANCE_FORWARD = "_wb_instance_forward"  # flag on the wrapper: forward was an instance attr
_NO_SKIP: frozenset[str] = frozenset()


class InputMove:
    """An input move the forward wrapper makes itself, instead of calling the hook (extension).

    A hook whose ``pre_forward`` only moves the inputs to one device, and whose
    ``post_forward`` returns the output unchanged, sets its ``input_move`` to one of these:
    the wrapper then moves the positional and keyword inputs itself and calls neither method
    (nor ``forward_failed``), saving two Python calls per module per forward. Inputs already
    on ``device`` cost one check each.

    Args:
        device: where the inputs go.
        non_blocking: passed to ``Tensor.to``.
        skip: keyword-input names (at any depth) never moved.

    Attributes:
        to_cpu: ``device`` is the CPU, tested per tensor with the cheaper ``Tensor.is_cpu``.

    Example:
        >>> InputMove(torch.device("cpu")).to_cpu
        True
    """

    __slots__ = ("device", "non_blocking", "skip", "to_cpu")

    def __init__(
        self, device: torch.device, non_blocking: bool = False, skip: frozenset[str] = _NO_SKIP
    ) -> None:
        self.device = device
        self.non_blocking = non_blocking
        self.skip = skip
        self.to_cpu = device.type == "cpu"

    def __repr__(self) -> str:
        return f"InputMove({self.device}, non_blocking={self.non_blocking}, skip={set(self.skip)})"


class ModelHook:
    """Callbacks around a module's forward. Subclass and override what you need.

    Attributes:
        no_grad: class attribute; when True the wrapped forward runs under ``torch.no_grad()``.
        input_move: None, or an ``InputMove`` the wrapper makes instead of calling
            ``pre_forward``/``post_forward`` (a hook that only moves inputs sets it; the
            hook keeps it up to date when its device or skip keys change).

    Example:
        >>> class Log(ModelHook):
        ...     def pre_forward(self, module, *args, **kwargs):
        ...         return args, kwargs
    """

    no_grad = False
    input_move: InputMove | None = None

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is attached; returns the module (possibly changed)."""
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        """Called before the forward with its inputs; returns the (args, kwargs) to use."""
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Called after the forward with its output; returns the output to give back."""
        return output

    def forward_failed(self, module: nn.Module, error: BaseException) -> None:
        """Called when the forward raised after ``pre_forward`` succeeded (extension).

        Release what ``pre_forward`` acquired; the error propagates afterwards.
        """

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is removed; returns the module."""
        return module

    def _repr_fields(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        fields = ", ".join(f"{key}={value!r}" for key, value in self._repr_fields().items())
        return f"{type(self).__name__}({fields})"


class SequentialHook(ModelHook):
    """Chains several hooks; each event calls them in order (``forward_failed`` in reverse).

    Example:
        >>> SequentialHook(ModelHook(), ModelHook())
        SequentialHook(ModelHook(), ModelHook())
    """

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = hooks

    @property
    def no_grad(self) -> bool:  # type: ignore[override]
        return any(hook.no_grad for hook in self.hooks)

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        done: list[ModelHook] = []
        try:
            for hook in self.hooks:
                args, kwargs = hook.pre_forward(module, *args, **kwargs)
                done.append(hook)
        except BaseException as error:
            for hook in reversed(done):
                hook.forward_failed(module, error)
            raise
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def forward_failed(self, module: nn.Module, error: BaseException) -> None:
        for hook in reversed(self.hooks):
            hook.forward_failed(module, error)

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module

    def __repr__(self) -> str:
        return f"SequentialHook({', '.join(repr(hook) for hook in self.hooks)})"


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The forward of a hooked module. Kept minimal: it runs once per module per call.

    The common case (a hook with an ``input_move``, no recorder, plain tensors already on a
    CPU execution device) costs two attribute reads on the module, one on the hook, one on its
    ``InputMove``, one global read and one type test plus one ``is_cpu`` per positional tensor,
    and no further call or allocation.
    """
    hook = module._hf_hook
    move = hook.input_move
    if move is not None and _transfers._recorder is None:
        if move.to_cpu:  # ``is_cpu`` is about twice as cheap as comparing devices
            for item in args:
                if item.__class__ is not Tensor or not item.is_cpu:
                    args = move_args(args, move.device, False)
                    break
        else:
            device = move.device
            for item in args:
                if item.__class__ is not Tensor or item.device != device:
                    args = move_args(args, device, move.non_blocking)
                    break
        if kwargs:
            kwargs = move_kwargs(kwargs, move.device, move.non_blocking, move.skip)
        return module._old_forward(*args, **kwargs)
    recorder = _transfers._recorder
    if recorder is not None:
        return _recorded_forward(module, hook, recorder, args, kwargs)
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    try:
        if hook.no_grad and torch.is_grad_enabled():  # no context manager when off
            with torch.no_grad():
                output = module._old_forward(*args, **kwargs)
        else:
            output = module._old_forward(*args, **kwargs)
    except BaseException as error:
        hook.forward_failed(module, error)
        raise
    return hook.post_forward(module, output)


def _recorded_forward(
    module: nn.Module, hook: ModelHook, recorder: _transfers.TransferRecorder, args, kwargs
) -> Any:
    """The same as ``_hooked_forward``, also reporting a ``kind="compute"`` event."""
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    start_s = time.perf_counter()
    try:
        with torch.set_grad_enabled(torch.is_grad_enabled() and not hook.no_grad):
            output = module._old_forward(*args, **kwargs)
    except BaseException as error:
        hook.forward_failed(module, error)
        raise
    end_s = time.perf_counter()
    name = getattr(hook, "module_name", None) or type(module).__name__
    device = getattr(hook, "execution_device", None)
    label = "" if device is None else _device_label(device)
    recorder(_transfers.TransferEvent(name, 0, label, label, start_s, end_s, kind="compute"))
    return hook.post_forward(module, output)


def _device_label(device: Any) -> str:
    if isinstance(device, int):
        return f"cuda:{device}"
    return str(device)


def _is_fx_graph_module(module: nn.Module) -> bool:
    # fx's GraphModuleImpl freezes an instance forward; patch its (per-instance) class instead.
    return "GraphModuleImpl" in type(module).__name__


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Attach ``hook`` to ``module`` by rewriting its ``forward``.

    Args:
        module: the module to hook.
        hook: the hook; its ``init_hook(module)`` runs now.
        append: when the module already has a hook, chain both in a ``SequentialHook`` (old
            first) instead of replacing it. A replaced hook is detached first.

    Returns:
        The module (what ``hook.init_hook`` returned).

    Example:
        >>> import torch
        >>> layer = add_hook_to_module(torch.nn.Linear(2, 2), ModelHook())
        >>> layer._hf_hook
        ModelHook()
    """
    old_hook = getattr(module, "_hf_hook", None)
    if old_hook is not None and "_old_forward" in module.__dict__:
        if not append:
            old_hook.detach_hook(module)
            del module._hf_hook
        module = hook.init_hook(module)
        if append:
            previous = old_hook.hooks if isinstance(old_hook, SequentialHook) else (old_hook,)
            hook = SequentialHook(*previous, hook)
        module._hf_hook = hook
        return module

    old_forward = module.forward
    had_instance_forward = "forward" in module.__dict__
    module._old_forward = old_forward
    module = hook.init_hook(module)
    module._hf_hook = hook
    wrapper = functools.update_wrapper(functools.partial(_hooked_forward, module), old_forward)
    setattr(wrapper, _INSTANCE_FORWARD, had_instance_forward)
    if _is_fx_graph_module(module):
        type(module).forward = wrapper
    else:
        module.forward = wrapper
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detach the hook of ``module`` and restore its original ``forward``.

    Args:
        module: the hooked module (a module without a hook is left unchanged).
        recurse: also remove the hooks of every submodule.

    Returns:
        The module.

    Example:
        >>> import torch
        >>> layer = add_hook_to_module(torch.nn.Linear(2, 2), ModelHook())
        >>> hasattr(remove_hook_from_module(layer), "_hf_hook")
        False
    """
    hook = module.__dict__.get("_hf_hook")
    if hook is not None:
        hook.detach_hook(module)
        del module._hf_hook
    old_forward = module.__dict__.pop("_old_forward", None)
    if old_forward is not None:
        if _is_fx_graph_module(module):
            type(module).forward = old_forward
        else:
            wrapper = module.__dict__.get("forward")
            if getattr(wrapper, _INSTANCE_FORWARD, True) is False:
                del module.forward
            else:
                module.forward = old_forward
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse=True)
    return module


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of ``module`` and of all its submodules, recursively.

    Example:
        >>> import torch
        >>> remove_hook_from_submodules(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    """
    remove_hook_from_module(module, recurse=True)


def iter_hooks(hook: ModelHook | None) -> list[ModelHook]:
    """The hooks inside ``hook``, flattening ``SequentialHook`` chains (helper)."""
    if hook is None:
        return []
    if isinstance(hook, SequentialHook):
        return [inner for child in hook.hooks for inner in iter_hooks(child)]
    return [hook]
