"""init_empty_weights / init_on_device: meta parameters, real buffers, full restoration."""

from __future__ import annotations

import psutil
import pytest
import torch
from torch import nn

from workbench.big_modeling.empty_init import init_empty_weights, init_on_device


class WithBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        # like a rotary embedding's inv_freq: computed in __init__, must stay usable
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)))


def test_parameters_go_to_meta_and_buffers_stay_real() -> None:
    with init_empty_weights():
        module = WithBuffer()
    assert module.linear.weight.device.type == "meta"
    assert module.linear.bias.device.type == "meta"
    assert module.inv_freq.device.type == "cpu"
    torch.testing.assert_close(module.inv_freq[0], torch.tensor(1.0))
    assert module.linear.weight.requires_grad
    assert isinstance(module.linear.weight, nn.Parameter)


def test_include_buffers_puts_buffers_on_meta_too() -> None:
    with init_empty_weights(include_buffers=True):
        module = WithBuffer()
        bare = torch.empty(3)
    assert module.inv_freq.device.type == "meta"
    assert module.linear.weight.device.type == "meta"
    assert bare.device.type == "meta"
    assert torch.empty(3).device.type == "cpu"  # the device context ended with the block


def test_everything_is_restored_even_after_an_exception() -> None:
    register_parameter = nn.Module.register_parameter
    register_buffer = nn.Module.register_buffer
    with pytest.raises(RuntimeError, match="boom"), init_empty_weights(include_buffers=True):
        nn.Linear(2, 2)
        raise RuntimeError("boom")
    assert nn.Module.register_parameter is register_parameter
    assert nn.Module.register_buffer is register_buffer
    assert nn.Linear(2, 2).weight.device.type == "cpu"
    assert torch.empty(1).device.type == "cpu"


def test_blocks_nest_and_the_inner_device_wins() -> None:
    with init_empty_weights():
        outer = nn.Linear(2, 2)
        with init_on_device("cpu"):
            inner = nn.Linear(2, 2)
        after = nn.Linear(2, 2)
    assert outer.weight.is_meta and after.weight.is_meta
    assert inner.weight.device.type == "cpu"
    assert nn.Linear(2, 2).weight.device.type == "cpu"


def test_parameter_subclass_and_attributes_survive() -> None:
    class TaggedParameter(nn.Parameter):
        def __new__(cls, data=None, requires_grad=True, tag=None):
            param = super().__new__(cls, data, requires_grad)
            param.tag = tag
            return param

    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = TaggedParameter(torch.ones(2), requires_grad=False, tag="q4")

    with init_empty_weights():
        holder = Holder()
    assert type(holder.weight) is TaggedParameter
    assert holder.weight.tag == "q4"
    assert holder.weight.is_meta
    assert not holder.weight.requires_grad


def test_init_on_device_rejects_disk() -> None:
    from workbench.big_modeling.errors import DeviceMapError

    with pytest.raises(DeviceMapError, match="disk"), init_on_device("disk"):
        pass


@pytest.mark.slow
def test_hundred_billion_parameters_cost_no_ram() -> None:
    """The time against torch's meta device is measured by ``benchmarks/bench_empty_init.py``."""
    # 1000 x Linear(10000, 10000) = 1e11 parameters, 400 GB in float32.
    process = psutil.Process()
    rss_before = process.memory_info().rss
    with init_empty_weights():
        model = nn.Sequential(*[nn.Linear(10000, 10000) for _ in range(1000)])
    rss_growth = process.memory_info().rss - rss_before
    assert sum(p.numel() for p in model.parameters()) == 1000 * (10000 * 10000 + 10000)
    assert all(p.is_meta for p in model.parameters())
    assert rss_growth < 100 * 2**20  # module objects only, never a weight


def test_init_functions_skip_meta_tensors_only_and_are_restored() -> None:
    original_uniform = torch.nn.init.uniform_
    real = torch.zeros(4)
    with init_empty_weights():
        layer = torch.nn.Linear(3, 2)
        torch.nn.init.uniform_(real, 1.0, 2.0)  # a real tensor inside the block is still filled
    assert layer.weight.is_meta
    assert bool(((real >= 1.0) & (real <= 2.0)).all())
    assert torch.nn.init.uniform_ is original_uniform


def test_init_functions_are_restored_after_an_exception() -> None:
    original_kaiming = torch.nn.init.kaiming_uniform_
    with pytest.raises(RuntimeError, match="boom"), init_empty_weights():
        raise RuntimeError("boom")
    assert torch.nn.init.kaiming_uniform_ is original_kaiming
