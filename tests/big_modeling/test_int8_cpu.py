"""torchao int8 weights on the CPU through one reused buffer per thread
(``quantization.int8_cpu``): torchao's own values to the bit, one buffer grown to the largest
weight, torchao's function for anything else."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8Tensor, quantize_

from workbench.big_modeling.quantization import int8_cpu
from workbench.big_modeling.quantization.backends import quantize_weight
from workbench.big_modeling.quantization.dense_buffers import (
    held_dequantize_buffer_bytes,
    release_dequantize_buffers,
)


@pytest.fixture(autouse=True)
def no_buffers() -> Iterator[None]:
    release_dequantize_buffers()
    yield
    release_dequantize_buffers()


def _torchao_linear(
    activation: torch.Tensor, weight: Int8Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """torchao's own ``F.linear`` for ``Int8Tensor``, the function ``install`` put ours before."""
    ours = Int8Tensor._TORCH_FN_TABLE[Int8Tensor][torch.nn.functional.linear]
    return ours.__wrapped__(torch.nn.functional.linear, (), (activation, weight, bias), {})


def test_install_put_ours_in_front_once() -> None:
    assert int8_cpu.install() is True  # backends installed it on import; again is a no-op
    table = Int8Tensor._TORCH_FN_TABLE[Int8Tensor]
    assert table[torch.nn.functional.linear].workbench_int8_cpu is True
    assert not getattr(table[torch.nn.functional.linear].__wrapped__, "workbench_int8_cpu", False)
    aten = Int8Tensor._ATEN_OP_TABLE[Int8Tensor][torch.ops.aten.linear.default]
    assert aten.workbench_int8_cpu is True


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("leading", [(1,), (7,), (2, 5)])
@pytest.mark.parametrize("bias", [False, True])
def test_the_values_are_torchaos_to_the_bit(
    dtype: torch.dtype, leading: tuple[int, ...], bias: bool
) -> None:
    torch.manual_seed(0)
    weight = quantize_weight(torch.randn(96, 160, dtype=dtype), "int8")
    assert int8_cpu.runs_dense(weight)
    x = torch.randn(*leading, 160, dtype=dtype)
    b = torch.randn(96, dtype=dtype) if bias else None
    ours = torch.nn.functional.linear(x, weight, b)
    assert ours.shape == (*leading, 96) and ours.dtype == dtype
    assert torch.equal(ours, _torchao_linear(x, weight, b))
    assert held_dequantize_buffer_bytes() == 96 * 160 * dtype.itemsize


def test_a_module_forward_uses_one_buffer_grown_to_the_largest_weight() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 32))
    model = model.to(torch.bfloat16)
    for layer in model:
        layer.weight = torch.nn.Parameter(quantize_weight(layer.weight.data, "int8"), False)
    for _ in range(3):
        model(torch.randn(4, 64, dtype=torch.bfloat16))
    assert held_dequantize_buffer_bytes() == 256 * 64 * 2  # the larger weight, once
    release_dequantize_buffers()
    assert held_dequantize_buffer_bytes() == 0


def test_dynamic_activation_int8_keeps_torchaos_function() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(160, 96, bias=False)
    quantize_(layer, Int8DynamicActivationInt8WeightConfig())
    assert isinstance(layer.weight, Int8Tensor)
    assert not int8_cpu.runs_dense(layer.weight)
    x = torch.randn(3, 160)
    assert torch.equal(layer(x), _torchao_linear(x, layer.weight, None))
    assert held_dequantize_buffer_bytes() == 0  # torchao's int8 x int8 kernel, no dense copy


def test_a_plain_weight_is_not_ours() -> None:
    assert not int8_cpu.runs_dense(torch.randn(4, 4))
