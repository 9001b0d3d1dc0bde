"""Layerwise casting on CPU: the bit-arithmetic fp8 kernel and the reused scratch buffers."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional

from workbench.big_modeling.hooks.casting import _upcast, attach_layerwise_casting_hooks
from workbench.big_modeling.hooks.casting_kernels import _CPU_CHUNK_NUMEL, fp8_upcast_cpu_into
from workbench.big_modeling.hooks.casting_scratch import ScratchPool

FP8 = torch.float8_e4m3fn
WIDTH = 256  # 256*256 = 65,536 weight elements: just big enough for the CPU kernel


def _every_code(rows: int, dtype: torch.dtype = FP8) -> torch.Tensor:
    """(rows, 256) fp8 tensor; each row holds all 256 codes (NaN, -0, subnormals, extremes)."""
    return torch.arange(256, dtype=torch.uint8).repeat(rows, 1).view(dtype)


def _assert_same_as_to(fast: torch.Tensor, stored: torch.Tensor) -> None:
    slow = stored.to(fast.dtype)
    assert fast.dtype == slow.dtype and fast.shape == slow.shape
    bytes_fast, bytes_slow = (t.contiguous().view(torch.uint8) for t in (fast, slow))
    assert torch.equal(bytes_fast, bytes_slow)  # NaN payloads and -0 too


@pytest.mark.parametrize(
    "compute", [torch.bfloat16, torch.float16, torch.float32, torch.float64], ids=str
)
@pytest.mark.parametrize("storage", [FP8, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize(
    "layout",
    [
        # 8,200*256 = 2,099,200 codes: one full chunk of 2,097,152, then a partial one
        pytest.param(lambda dtype: _every_code(8_200, dtype), id="two_chunks"),
        # every two-code word once: each entry of the pair table is read
        pytest.param(
            lambda dtype: (
                torch.arange(1 << 16, dtype=torch.int32)
                .to(torch.uint16)
                .view(torch.uint8)
                .view(dtype)
                .view(256, 512)
            ),
            id="every_pair",
        ),
        # an odd count of codes cannot be read as 16-bit pairs: the one-code table does it
        pytest.param(lambda dtype: _every_code(3, dtype).reshape(-1)[:-1], id="odd_count"),
        pytest.param(lambda dtype: _every_code(64, dtype).t(), id="transposed"),
        pytest.param(
            lambda dtype: _every_code(6, dtype).view(6, 16, 16).permute(2, 0, 1), id="permuted_3d"
        ),
    ],
)
def test_cpu_fp8_kernel_is_bit_exact_for_every_code(compute, storage, layout) -> None:
    stored = layout(storage)
    out = torch.empty_like(stored, dtype=compute)
    assert out.stride() == stored.stride()
    assert fp8_upcast_cpu_into(stored, out)
    _assert_same_as_to(out, stored)
    if stored.numel() > _CPU_CHUNK_NUMEL:  # the tail chunk is written too
        # 2,097,152 / 256 = 8,192 rows in the first chunk; 8 rows after it, 0x7F in each
        assert out.reshape(-1)[_CPU_CHUNK_NUMEL:].view(-1, 256)[:, 0x7F].isnan().all()


def test_cpu_fp8_kernel_handles_an_odd_offset_into_storage() -> None:
    stored = _every_code(4).reshape(-1)[1:-1]  # 1,022 codes starting at byte 1 of the storage
    backing = torch.full((stored.numel() + 1,), 7.0, dtype=torch.bfloat16)
    out = backing[1:]  # and the results starting at element 1: no aligned 32-bit view
    assert fp8_upcast_cpu_into(stored, out)
    _assert_same_as_to(out, stored)
    assert backing[0].item() == 7.0


def test_cpu_fp8_kernel_declines_what_it_cannot_do() -> None:
    stored = _every_code(8)
    gappy = stored[:, ::2]  # not dense: empty_like cannot copy its strides
    out = torch.full(gappy.shape, 7.0, dtype=torch.bfloat16)
    assert not fp8_upcast_cpu_into(gappy, out)
    assert torch.equal(out, torch.full(gappy.shape, 7.0, dtype=torch.bfloat16))  # untouched
    assert not fp8_upcast_cpu_into(stored, torch.empty(8, 128))  # another shape
    assert not fp8_upcast_cpu_into(stored.to(torch.bfloat16), torch.empty(stored.shape))
    # _upcast falls back to an exact copy
    _assert_same_as_to(_upcast(gappy, torch.bfloat16, False, "auto", out), gappy)


def test_cpu_fp8_kernel_does_no_float_arithmetic_that_denormal_flushing_could_change() -> None:
    stored = _every_code(300)  # 76,800 codes: above the hook's threshold for the kernel
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        fast = _upcast(stored, torch.bfloat16, False, "auto")
    finally:
        torch.set_flush_denormal(False)
    _assert_same_as_to(fast, stored)  # e4m3 subnormals (0x01..0x07) stay, not flushed to zero


def _stack(depth: int = 3) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(depth)))


def _manual_forward(model: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    for layer in model:
        weight = layer.weight.detach().to(FP8).to(torch.bfloat16)
        x = functional.linear(x, weight, layer.bias.detach().to(FP8).to(torch.bfloat16))
    return x


@pytest.fixture
def linear_calls(monkeypatch):
    """(weight data_ptr, weight dtype) of each functional.linear call; Linear.forward uses it."""
    calls: list[tuple[int, torch.dtype]] = []
    real_linear = functional.linear

    def spy(x, weight, bias=None):
        calls.append((weight.data_ptr(), weight.dtype))
        return real_linear(x, weight, bias)

    monkeypatch.setattr(functional, "linear", spy)
    return calls


def test_no_grad_forward_reuses_one_buffer_per_shape(linear_calls) -> None:
    model = _stack()
    reference = copy.deepcopy(model)
    attach_layerwise_casting_hooks(model, FP8, torch.bfloat16)
    x = torch.randn(4, WIDTH, dtype=torch.bfloat16)
    with torch.no_grad():
        first, second = model(x), model(x)
    assert len(linear_calls) == 6 and {dtype for _, dtype in linear_calls} == {torch.bfloat16}
    assert len({ptr for ptr, _ in linear_calls}) == 1  # one buffer for all six up-casts
    expected = _manual_forward(reference, x)
    torch.testing.assert_close(first, expected, rtol=0, atol=0)
    torch.testing.assert_close(second, expected, rtol=0, atol=0)
    # the pool keeps one weight and one bias buffer: 256*256*2 + 256*2 = 131,584 B
    assert model[0]._hf_hook.scratch.nbytes() == 131_584
    assert {p.dtype for p in model.parameters()} == {FP8}


def test_grad_mode_never_shares_buffers(linear_calls) -> None:
    """Frozen fp8 weights, input that needs a gradient: autograd saves each up-cast copy to
    compute the input's gradient, so the copies must not share a buffer."""
    model = _stack()
    reference = copy.deepcopy(model)
    attach_layerwise_casting_hooks(model, FP8, torch.bfloat16)
    model.requires_grad_(False)  # the copies come from the fast kernel, not from autograd
    x = torch.randn(4, WIDTH, dtype=torch.bfloat16, requires_grad=True)
    model(x).float().square().sum().backward()
    pointers = {ptr for ptr, _ in linear_calls}
    x_ref = x.detach().clone().requires_grad_(True)
    _manual_forward(reference, x_ref).float().square().sum().backward()
    assert len(pointers) == 3
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=0)


def test_pool_only_for_layers_with_a_stock_forward() -> None:
    class Plain(nn.Linear):  # inherits Linear.forward
        pass

    class Custom(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x)

    model = nn.Sequential(nn.Linear(4, 4), Plain(4, 4), Custom(4, 4), nn.Conv1d(4, 4, 1))
    attach_layerwise_casting_hooks(model, torch.bfloat16, torch.float32)
    pools = [layer._hf_hook.scratch for layer in model]
    assert pools[0] is not None and pools[1] is pools[0] and pools[3] is pools[0]
    assert pools[2] is None  # its forward could keep a reference to the weight


def test_reentrant_forward_gets_its_own_buffer(monkeypatch) -> None:
    """A layer that runs while another layer's copy is in use must not overwrite that copy."""
    outer, inner = _stack(depth=2)
    reference_outer, reference_inner = copy.deepcopy(outer), copy.deepcopy(inner)
    model = nn.Sequential(outer, inner)
    attach_layerwise_casting_hooks(model, FP8, torch.bfloat16)
    x = torch.randn(2, WIDTH, dtype=torch.bfloat16)
    real_linear = functional.linear
    nested: list[torch.Tensor] = []
    pointers: list[int] = []

    def linear_running_inner_first(x, weight, bias=None):
        pointers.append(weight.data_ptr())
        if len(pointers) == 1:  # outer's call: run inner while outer's copy is alive
            nested.append(inner(x))
        return real_linear(x, weight, bias)

    monkeypatch.setattr(functional, "linear", linear_running_inner_first)
    with torch.no_grad():
        output = outer(x)
    assert pointers[0] != pointers[1]
    torch.testing.assert_close(output, _manual_forward(nn.Sequential(reference_outer), x))
    torch.testing.assert_close(nested[0], _manual_forward(nn.Sequential(reference_inner), x))


def test_scratch_pool_hands_a_buffer_to_one_user_at_a_time() -> None:
    pool = ScratchPool()
    stored = torch.zeros(3, 5, dtype=FP8).t()
    first, second = pool.take(stored, torch.bfloat16), pool.take(stored, torch.bfloat16)
    assert first.data_ptr() != second.data_ptr()
    assert first.stride() == stored.stride() and first.dtype == torch.bfloat16
    pool.give_back(stored, first)
    assert pool.take(stored, torch.float16) is not first  # another dtype: another layout
    assert pool.take(stored, torch.bfloat16) is first
    assert pool.take(stored, torch.bfloat16) is not first
