"""4-bit CPU matmuls through one reused buffer per thread (``quantization.bnb4_cpu``): the same
values as bitsandbytes' own dequantize, one buffer grown to the largest weight, freed on
release or with its thread."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from workbench.big_modeling.quantization import bnb4_cpu
from workbench.big_modeling.quantization.bnb4_cpu import dequantize_4bit_into
from workbench.big_modeling.quantization.dense_buffers import (
    dequantize_buffer_nbytes,
    held_dequantize_buffer_bytes,
    release_dequantize_buffers,
)

pytest.importorskip("bitsandbytes", reason="nf4/fp4 need bitsandbytes (dev extra)")

from workbench.big_modeling.quantization.bnb4 import quantize_4bit


@pytest.fixture(autouse=True)
def no_buffers() -> None:
    release_dequantize_buffers()
    yield
    release_dequantize_buffers()


@pytest.mark.parametrize("name", ["nf4", "nf4-dq", "fp4", "fp4-dq"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(96, 192), (512, 64), (33, 70), (7, 9)])
def test_dequantized_into_a_buffer_equals_bitsandbytes_dequantize(
    name: str, dtype: torch.dtype, shape: tuple[int, int]
) -> None:
    # (7, 9): an odd last dimension, which bitsandbytes' CPU op computes in torch (fallback)
    torch.manual_seed(0)
    packed = quantize_4bit(torch.randn(shape, dtype=dtype) * 0.02, name)
    out = torch.full(shape, float("nan"), dtype=dtype)
    assert dequantize_4bit_into(packed, out) is out
    assert torch.equal(out, packed.dequantize())
    x = torch.randn(3, 5, shape[1], dtype=dtype)
    got = torch.nn.functional.linear(x, packed)
    assert torch.equal(got, torch.nn.functional.linear(x, packed.dequantize()))


def test_without_the_native_kernel_the_op_result_is_copied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    packed = quantize_4bit(torch.randn(64, 128, dtype=torch.bfloat16), "nf4")
    monkeypatch.setattr(bnb4_cpu, "_native_kernel", lambda quant_type, dtype: None)
    out = torch.empty(64, 128, dtype=torch.bfloat16)
    assert torch.equal(dequantize_4bit_into(packed, out), packed.dequantize())


def test_one_buffer_per_dtype_grows_to_the_largest_weight_and_is_released() -> None:
    small = quantize_4bit(torch.randn(64, 128, dtype=torch.bfloat16), "nf4")
    large = quantize_4bit(torch.randn(256, 128, dtype=torch.bfloat16), "nf4")
    other = quantize_4bit(torch.randn(32, 32, dtype=torch.float32), "fp4")
    for weight in (small, large, small, other):
        x = torch.ones(2, weight.shape[1], dtype=weight.dtype)
        torch.nn.functional.linear(x, weight)
    # bf16: the larger weight's 256 x 128 x 2 B, float32: 32 x 32 x 4 B
    expected = 256 * 128 * 2 + 32 * 32 * 4
    assert held_dequantize_buffer_bytes() == expected
    assert expected == dequantize_buffer_nbytes(
        [(tuple(w.shape), w.dtype) for w in (small, large, other)]
    )
    release_dequantize_buffers()
    assert held_dequantize_buffer_bytes() == 0


def test_a_thread_has_its_own_buffer_which_ends_with_it() -> None:
    weight = quantize_4bit(torch.randn(128, 64, dtype=torch.bfloat16), "nf4")
    held_inside: list[int] = []

    def work() -> None:
        torch.nn.functional.linear(torch.ones(1, 64, dtype=torch.bfloat16), weight)
        held_inside.append(held_dequantize_buffer_bytes())

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert held_inside == [128 * 64 * 2]
    del thread
    gc.collect()
    assert held_dequantize_buffer_bytes() == 0


def test_an_expert_of_a_fused_weight_counts_one_expert() -> None:
    assert dequantize_buffer_nbytes([((8, 64, 32), torch.bfloat16)]) == 64 * 32 * 2
    assert dequantize_buffer_nbytes([]) == 0
