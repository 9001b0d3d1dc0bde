"""Whole-model offload hooks for pipelines: the model lives on CPU until it runs.

Example:
    >>> import torch
    >>> from workbench.big_modeling.hooks.base import add_hook_to_module
    >>> model = add_hook_to_module(torch.nn.Linear(2, 2), CpuOffload("cpu"))
    >>> model._hf_hook
    CpuOffload(execution_device='cpu', on_device=False)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from workbench.big_modeling.devices import to_torch_device
from workbench.big_modeling.hooks.base import ModelHook, add_hook_to_module, remove_hook_from_module
from workbench.big_modeling.hooks.io_moves import send_to_device


class CpuOffload(ModelHook):
    """Moves the whole module to ``execution_device`` before its forward; back on ``offload``.

    Args:
        execution_device: where the forward runs.
        prev_module_hook: a ``UserCpuOffloadHook`` whose model is offloaded before this runs.
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        prev_module_hook: UserCpuOffloadHook | None = None,
    ) -> None:
        self.execution_device = "cpu" if execution_device is None else execution_device
        self._device = to_torch_device(self.execution_device)
        self.prev_module_hook = prev_module_hook
        self.on_device = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        self.on_device = False
        return module.to("cpu")

    def offload(self, module: nn.Module) -> None:
        """Move ``module`` back to the CPU (a no-op when it is there)."""
        if self.on_device and self._device.type != "cpu":
            module.to("cpu")
            if self._device.type == "cuda":
                torch.cuda.empty_cache()
        self.on_device = False

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        if self.prev_module_hook is not None:
            self.prev_module_hook.offload()
        if not self.on_device:
            module.to(self._device)
            self.on_device = True
        return send_to_device(args, self._device), send_to_device(kwargs, self._device)

    def _repr_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"execution_device": self.execution_device}
        if self.prev_module_hook is not None:
            fields["after"] = type(self.prev_module_hook.model).__name__
        fields["on_device"] = self.on_device
        return fields


class UserCpuOffloadHook:
    """What ``cpu_offload_with_hook`` returns: ``offload()`` and ``remove()`` for one model.

    Example:
        >>> import torch
        >>> from workbench.big_modeling.hooks.base import add_hook_to_module
        >>> model = torch.nn.Linear(2, 2)
        >>> hook = CpuOffload("cpu")
        >>> user_hook = UserCpuOffloadHook(add_hook_to_module(model, hook), hook)
        >>> user_hook.remove()
    """

    def __init__(self, model: nn.Module, hook: CpuOffload) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        """Move the model back to the CPU."""
        self.hook.offload(self.model)

    def remove(self) -> None:
        """Detach the hook; the model stays where it is."""
        remove_hook_from_module(self.model)

    def __repr__(self) -> str:
        return f"UserCpuOffloadHook({type(self.model).__name__}, {self.hook!r})"


def _default_offload_device() -> torch.device:
    if torch.backends.mps.is_available():
        return torch.device("mps")
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


def cpu_offload_with_hook(
    model: nn.Module,
    execution_device: int | str | torch.device | None = None,
    prev_module_hook: UserCpuOffloadHook | None = None,
) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Move the whole model to ``execution_device`` at its first forward; keep it there.

    It goes back to the CPU when the returned hook's ``offload()`` is called, or, with
    ``prev_module_hook``, the previous model goes back right before this one runs.

    Args:
        model: the model.
        execution_device: default: MPS if available, else cuda:0 if present, else CPU.
        prev_module_hook: the hook returned for the model that runs before this one.

    Returns:
        ``(model, hook)``; ``hook.offload()`` moves the model to CPU, ``hook.remove()`` detaches.

    Example:
        >>> import torch
        >>> model, hook = cpu_offload_with_hook(torch.nn.Linear(2, 2), "cpu")
        >>> hook.offload()
    """
    device = _default_offload_device() if execution_device is None else execution_device
    hook = CpuOffload(execution_device=device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)
