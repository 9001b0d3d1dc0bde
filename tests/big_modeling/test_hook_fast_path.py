"""The inlined fast path of non-offloading AlignDevicesHooks keeps every promise of the slow one.

CPU only: ``meta`` stands in for a second device.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from workbench.big_modeling.hooks.align import AlignDevicesHook
from workbench.big_modeling.hooks.base import ModelHook, add_hook_to_module, remove_hook_from_module
from workbench.big_modeling.hooks.io_moves import move_args, move_kwargs
from workbench.big_modeling.transfers import recording_transfers

CPU = torch.device("cpu")
META = torch.device("meta")


class Echo(nn.Module):
    """Returns what its forward received, so a test can see where each input went."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1))

    def forward(self, *args, **kwargs):
        return args, kwargs


def _inline_cpu(hook: ModelHook) -> bool:
    return hook.input_move is not None and hook.input_move.to_cpu


def test_only_plain_cpu_hooks_take_the_cpu_test() -> None:
    assert _inline_cpu(AlignDevicesHook("cpu"))
    assert not _inline_cpu(AlignDevicesHook(META))
    assert not _inline_cpu(AlignDevicesHook("cpu", io_same_device=True))
    assert not _inline_cpu(AlignDevicesHook("cpu", offload=True))
    assert not _inline_cpu(AlignDevicesHook(None))
    assert not _inline_cpu(ModelHook())


def test_changing_skip_keys_after_attaching_reaches_the_inlined_move() -> None:
    hook = AlignDevicesHook(META)
    module = add_hook_to_module(Echo(), hook)
    x = torch.ones(1)
    _, kwargs = module(cache=x)
    assert kwargs["cache"].device == META
    hook.skip_keys = ["cache"]
    _, kwargs = module(cache=x)
    assert kwargs["cache"] is x


def test_changing_the_execution_device_after_attaching_moves_inputs_there() -> None:
    hook = AlignDevicesHook("cpu")
    module = add_hook_to_module(Echo(), hook)
    x = torch.ones(1)
    (got,), _ = module(x)
    assert got is x  # already on the CPU: passed through, not copied
    hook.execution_device = META
    assert not _inline_cpu(hook) and hook.input_move is not None
    (got,), _ = module(x)
    assert got.device == META


def test_an_input_off_the_cpu_is_not_passed_through_by_the_cpu_test() -> None:
    module = add_hook_to_module(Echo(), AlignDevicesHook("cpu"))
    # meta cannot be copied to the CPU: the error proves the hook tried to move it
    with pytest.raises(NotImplementedError):
        module(torch.ones(1, device=META))


def test_fast_path_moves_nested_args_and_kwargs_and_honours_skip_keys() -> None:
    module = add_hook_to_module(Echo(), AlignDevicesHook(META, skip_keys="cache"))
    cache = torch.ones(1)
    args, kwargs = module(
        (torch.ones(1), 2), None, mask=torch.ones(1), cache=cache, flag=True, dtype=torch.float16
    )
    assert args[0][0].device == META and args[0][1] == 2 and args[1] is None
    assert kwargs["mask"].device == META
    assert kwargs["cache"] is cache  # skipped key stays put
    assert kwargs["flag"] is True and kwargs["dtype"] is torch.float16


def test_subclass_and_parameter_inputs_take_the_general_move() -> None:
    module = add_hook_to_module(Echo(), AlignDevicesHook(META))
    param = nn.Parameter(torch.ones(1))
    (got,), _ = module(param)
    assert got.device == META


def test_direct_forward_call_takes_the_fast_path_too() -> None:
    module = add_hook_to_module(Echo(), AlignDevicesHook(META))
    (got,), kwargs = module.forward(torch.ones(1), mask=torch.ones(1))
    assert got.device == META and kwargs["mask"].device == META


def test_moves_return_the_same_containers_when_nothing_moves() -> None:
    x = torch.ones(1)
    args = (x, None, 3, 1.5, "text", torch.float32, CPU, torch.Size([2]))
    assert move_args(args, CPU, False) is args
    kwargs = {"x": x, "use_cache": False, "cache": torch.ones(1, device=META)}
    assert move_kwargs(kwargs, CPU, False, frozenset({"cache"})) is kwargs
    moved = move_kwargs(kwargs, META, False, frozenset({"cache"}))
    assert moved is not kwargs and moved["x"].device == META and moved["use_cache"] is False


def test_recorder_reports_compute_for_an_inlined_hook_and_inputs_still_move() -> None:
    module = add_hook_to_module(Echo(), AlignDevicesHook(META, module_name="echo"))
    events = []
    with recording_transfers(events.append):
        (got,), _ = module(torch.ones(1))
    assert got.device == META
    assert [(e.kind, e.module, e.destination) for e in events] == [("compute", "echo", "meta")]


def test_no_grad_hook_still_disables_grad_and_leaves_no_grad_mode_alone() -> None:
    class NoGrad(ModelHook):
        no_grad = True

    layer = add_hook_to_module(nn.Linear(2, 2), NoGrad())
    assert not layer(torch.ones(1, 2)).requires_grad
    assert torch.is_grad_enabled()  # restored after the forward
    with torch.no_grad():
        assert not layer(torch.ones(1, 2)).requires_grad
        assert not torch.is_grad_enabled()


def test_no_grad_hook_restores_grad_mode_when_the_forward_raises() -> None:
    class NoGrad(ModelHook):
        no_grad = True

    class Failing(nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    module = add_hook_to_module(Failing(), NoGrad())
    with pytest.raises(RuntimeError, match="boom"):
        module(torch.ones(1))
    assert torch.is_grad_enabled()


def test_deep_copy_and_removal_keep_working_with_the_fast_path() -> None:
    module = add_hook_to_module(Echo(), AlignDevicesHook(META))
    clone = copy.deepcopy(module)
    (got,), _ = clone(torch.ones(1))
    assert got.device == META and clone.forward.args[0] is clone
    remove_hook_from_module(module)
    assert "forward" not in module.__dict__
    (got,), _ = module(torch.ones(1))
    assert got.device == CPU
