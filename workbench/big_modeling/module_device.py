"""Questions about one module's offloaded tensors: are there any, and bring them here for a while.

Example:
    >>> import torch
    >>> layer = torch.nn.Linear(2, 2)
    >>> has_offloaded_params(layer)
    False
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from workbench.big_modeling.align_hook import _offloading_hook
from workbench.big_modeling.devices import to_torch_device
from workbench.big_modeling.tensor_slots import place_tensor

__all__ = ["align_module_device", "has_offloaded_params"]

Device = int | str | torch.device


def has_offloaded_params(module: nn.Module) -> bool:
    """True when ``module`` has an offloading ``AlignDevicesHook`` attached.

    Example:
        >>> import torch
        >>> has_offloaded_params(torch.nn.Linear(2, 2))
        False
    """
    return _offloading_hook(module) is not None


@contextmanager
def align_module_device(
    module: nn.Module, execution_device: Device | None = None
) -> Iterator[None]:
    """Within the block, ``module``'s direct parameters are on the execution device.

    For an offloaded module its hook materialises the weights (on ``execution_device`` when
    given, else the hook's); otherwise parameters are moved to ``execution_device`` and back.

    Args:
        module: the module.
        execution_device: where to put the parameters; None uses the hook's device.

    Example:
        >>> import torch
        >>> layer = torch.nn.Linear(2, 2)
        >>> with align_module_device(layer, "cpu"):
        ...     layer.weight.device
        device(type='cpu')
    """
    hook = _offloading_hook(module)
    if hook is not None:
        original = hook.execution_device
        if execution_device is not None:
            hook.execution_device = execution_device
        try:
            hook.pre_forward(module)
            try:
                yield
            finally:
                hook.post_forward(module, None)
        finally:
            hook.execution_device = original
    elif execution_device is not None:
        device = to_torch_device(execution_device)
        originals = dict(module._parameters)
        try:
            for name, param in originals.items():
                if param is not None:
                    place_tensor(module, name, True, param, device, None)
            yield
        finally:
            module._parameters.update(originals)
    else:
        yield
