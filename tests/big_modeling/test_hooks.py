"""ModelHook plumbing: attach, append, replace, remove, exceptions, signatures, events."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from torch import nn

from workbench.big_modeling.hooks.base import (
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from workbench.big_modeling.transfers import recording_transfers


class Recorder(ModelHook):
    """Logs every event into a shared list under its label."""

    def __init__(self, label: str, log: list[str]) -> None:
        self.label, self.log = label, log

    def init_hook(self, module):
        self.log.append(f"{self.label}.init")
        return module

    def pre_forward(self, module, *args, **kwargs):
        self.log.append(f"{self.label}.pre")
        return args, kwargs

    def post_forward(self, module, output):
        self.log.append(f"{self.label}.post")
        return output

    def forward_failed(self, module, error):
        self.log.append(f"{self.label}.failed:{type(error).__name__}")

    def detach_hook(self, module):
        self.log.append(f"{self.label}.detach")
        return module


class AddOne(ModelHook):
    def pre_forward(self, module, *args, **kwargs):
        return (args[0] + 1, *args[1:]), kwargs


class Scale(nn.Module):
    def forward(self, x: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
        return x * factor


def test_hook_runs_through_call_and_direct_forward() -> None:
    module = add_hook_to_module(Scale(), AddOne())
    x = torch.zeros(2)
    assert module(x).tolist() == [2.0, 2.0]
    assert module.forward(x).tolist() == [2.0, 2.0]  # direct forward calls also run the hook
    assert module(x, factor=3.0).tolist() == [3.0, 3.0]  # kwargs reach the forward


def test_wrapped_forward_keeps_name_and_signature() -> None:
    module = Scale()
    expected = inspect.signature(module.forward)
    add_hook_to_module(module, ModelHook())
    assert module.forward.__name__ == "forward"
    assert inspect.signature(module.forward) == expected
    assert list(inspect.signature(module.forward).parameters) == ["x", "factor"]


def test_attributes_read_by_transformers_and_peft() -> None:
    module = Scale()
    original = module.forward
    hook = ModelHook()
    add_hook_to_module(module, hook)
    assert module._hf_hook is hook
    assert module._old_forward == original


def test_remove_restores_the_class_forward_exactly() -> None:
    module = add_hook_to_module(Scale(), AddOne())
    remove_hook_from_module(module)
    assert "forward" not in module.__dict__  # no stale bound method left behind
    assert not hasattr(module, "_hf_hook")
    assert not hasattr(module, "_old_forward")
    assert module(torch.ones(1)).tolist() == [2.0]


def test_remove_restores_an_instance_forward() -> None:
    module = Scale()

    def custom(x: torch.Tensor) -> torch.Tensor:
        return x - 1

    module.forward = custom
    add_hook_to_module(module, AddOne())
    assert module(torch.zeros(1)).tolist() == [0.0]
    remove_hook_from_module(module)
    assert module.forward is custom


def test_append_chains_hooks_in_order_without_reinitialising() -> None:
    log: list[str] = []
    module = add_hook_to_module(Scale(), Recorder("a", log))
    add_hook_to_module(module, Recorder("b", log), append=True)
    add_hook_to_module(module, Recorder("c", log), append=True)
    assert isinstance(module._hf_hook, SequentialHook)
    assert len(module._hf_hook.hooks) == 3  # flattened, not nested
    module(torch.ones(1))
    assert log == [
        "a.init",
        "b.init",
        "c.init",
        "a.pre",
        "b.pre",
        "c.pre",
        "a.post",
        "b.post",
        "c.post",
    ]


def test_replacing_a_hook_detaches_the_old_one() -> None:
    log: list[str] = []
    module = add_hook_to_module(Scale(), Recorder("old", log))
    add_hook_to_module(module, Recorder("new", log))
    module(torch.ones(1))
    assert log == ["old.init", "old.detach", "new.init", "new.pre", "new.post"]
    remove_hook_from_module(module)
    assert log[-1] == "new.detach"
    assert "forward" not in module.__dict__


def test_exception_in_forward_runs_cleanup_and_propagates() -> None:
    log: list[str] = []

    class Broken(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    module = add_hook_to_module(Broken(), Recorder("a", log))
    add_hook_to_module(module, Recorder("b", log), append=True)
    with pytest.raises(ValueError, match="boom"):
        module(torch.ones(1))
    assert log[-4:] == ["a.pre", "b.pre", "b.failed:ValueError", "a.failed:ValueError"]


def test_exception_in_a_later_pre_forward_releases_the_earlier_hooks() -> None:
    log: list[str] = []

    class FailingPre(ModelHook):
        def pre_forward(self, module, *args, **kwargs):
            raise RuntimeError("cannot load")

    module = add_hook_to_module(Scale(), Recorder("a", log))
    add_hook_to_module(module, FailingPre(), append=True)
    with pytest.raises(RuntimeError, match="cannot load"):
        module(torch.ones(1))
    assert log[-2:] == ["a.pre", "a.failed:RuntimeError"]


def test_no_grad_hook() -> None:
    class NoGrad(ModelHook):
        no_grad = True

    layer = nn.Linear(2, 2)
    assert layer(torch.ones(1, 2)).requires_grad
    add_hook_to_module(layer, NoGrad())
    assert not layer(torch.ones(1, 2)).requires_grad
    add_hook_to_module(layer, ModelHook(), append=True)  # a chain is no_grad if any hook is
    assert not layer(torch.ones(1, 2)).requires_grad


def test_remove_recursively_and_from_submodules() -> None:
    model = nn.Sequential(nn.Sequential(Scale(), Scale()), Scale())
    for module in model.modules():
        add_hook_to_module(module, AddOne())
    remove_hook_from_module(model)
    assert "_hf_hook" not in model.__dict__
    assert "_hf_hook" in model[0][1].__dict__
    remove_hook_from_submodules(model)
    assert not any("_hf_hook" in m.__dict__ or "forward" in m.__dict__ for m in model.modules())
    assert model(torch.ones(1)).tolist() == [8.0]


def test_remove_with_recurse() -> None:
    model = nn.Sequential(Scale(), Scale())
    for module in model.modules():
        add_hook_to_module(module, AddOne())
    remove_hook_from_module(model, recurse=True)
    assert not any("_hf_hook" in m.__dict__ for m in model.modules())


def test_hooked_module_deep_copies_with_its_own_hook() -> None:
    model = add_hook_to_module(Scale(), AddOne())
    clone = copy.deepcopy(model)
    assert clone._hf_hook is not model._hf_hook
    assert clone.forward.args[0] is clone  # the wrapper points at the copy, not the original
    assert clone(torch.zeros(1)).tolist() == [2.0]


def test_readable_repr() -> None:
    hook = SequentialHook(ModelHook(), AddOne())
    assert repr(hook) == "SequentialHook(ModelHook(), AddOne())"


def test_compute_events_are_reported_only_with_a_recorder() -> None:
    module = add_hook_to_module(Scale(), ModelHook())
    events = []
    module(torch.ones(1))
    with recording_transfers(events.append):
        module(torch.ones(1))
    module(torch.ones(1))
    assert [(e.kind, e.module, e.nbytes) for e in events] == [("compute", "Scale", 0)]
    assert events[0].end_s >= events[0].start_s


def _largest_allocation(run) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    return max((e.cpu_memory_usage for e in prof.events()), default=0)


def test_an_offloaded_head_is_not_copied_for_a_last_position_input(tmp_path) -> None:
    """A causal LM's prefill gives its output layer ``hidden[:, -1:, :]`` (contiguous, strides
    ``(T * H, H, 1)``); matmul then broadcast the onloaded weight into a batched product and
    copied all of it (SmolLM2-135M's 54 MiB head on disk, per prefill). The hook passes the
    same bytes with row-major strides: nothing as large as the weight is allocated."""
    from workbench.big_modeling import dispatch_model

    torch.manual_seed(0)
    head = nn.Linear(256, 4096, bias=False, dtype=torch.bfloat16)  # 2 MiB
    hidden = torch.randn(1, 8, 256, dtype=torch.bfloat16)
    expected = head(hidden[:, -1:, :]).detach()
    model = nn.Sequential(head)
    dispatch_model(model, {"": "disk"}, offload_dir=tmp_path)
    weight_nbytes = 256 * 4096 * 2
    with torch.inference_mode():
        last = hidden[:, -1:, :]
        assert last.stride() == (8 * 256, 256, 1)
        out = model(last)
        assert _largest_allocation(lambda: model(last)) < weight_nbytes // 4
    torch.testing.assert_close(out, expected)
