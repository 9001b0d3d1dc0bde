"""``backends.warm_up_quantization``: each precision's first quantization and matmul run before
a load measures its weights (issue 21), whatever the compute dtype; plain dtypes are nothing to
warm, and a name no library makes is returned for the load to report."""

from __future__ import annotations

import pytest
import torch

from workbench.big_modeling.quantization.backends import WARM_UP_SIDE, warm_up_quantization
from workbench.big_modeling.quantization.dense_buffers import (
    held_dequantize_buffer_bytes,
    release_dequantize_buffers,
)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_every_cpu_precision_warms_in_the_weights_dtype(dtype: torch.dtype) -> None:
    pytest.importorskip("bitsandbytes")
    release_dequantize_buffers()
    failed = warm_up_quantization(
        ["int8", "int4-g128", "nf4", "fp4", "fp8", dtype_name(dtype)], dtype
    )
    assert failed == []
    # the nf4/fp4 and int8 matmuls ran: this thread holds their dense buffer of the warm-up
    # weight in the compute dtype (int4 runs tinygemm, fp8 dequantizes per call)
    assert held_dequantize_buffer_bytes() >= WARM_UP_SIDE * WARM_UP_SIDE * dtype.itemsize
    release_dequantize_buffers()


def test_names_no_library_makes_are_returned_and_dtypes_skipped() -> None:
    assert warm_up_quantization(["bfloat16", "float32"], torch.float16) == []
    assert warm_up_quantization(["int3", "int8"], torch.float16) == ["int3"]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
