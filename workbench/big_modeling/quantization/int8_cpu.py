"""torchao's int8 weight-only matmul on the CPU through one reused buffer, no heap churn.

torchao 0.18 runs an ``Int8Tensor`` weight (``Int8WeightOnlyConfig``: per-row scales) as
``mm(x, qdata.t().to(x.dtype)) * scale``, on every device: each call casts the whole int8 weight
to a new dense tensor. On the CPU, under glibc's dynamic mmap threshold, those per-call blocks
(1.7 MiB for each of SmolLM2-135M's MLP weights in bfloat16) fragment the heap between the
activations, as bitsandbytes' per-call copies did (``bnb4_cpu``): an int8 SmolLM2 run peaked
15-22 MiB above its live tensors, -8.6% to -12.5% against the prediction on a 2-core AVX-512
CPU (issue 21).

``install()`` puts ``linear_int8_cpu`` in front of torchao's ``F.linear`` / ``aten.linear`` for
``Int8Tensor``: a CPU weight-only per-row weight is cast into this thread's dense buffer
(``dense_buffers``, shared with the 4-bit weights), then one ``mm``, the scale and the bias
applied in place. The arithmetic is torchao's, to the bit (the same cast, the same ``mm``, the
same multiply in the output dtype); anything else (a GPU weight, per-group scales, dynamic
activation quantization, an activation pre-scale) goes to torchao's own function. On a GPU
torchao's per-call copy stays: the caching allocator reuses its blocks, and the memory model
counts one copy of the largest weight at the peak (``runtime.memory_prediction``).

torch's own ``_weight_int8pack_mm`` was measured instead on that CPU (1536 x 576, bfloat16): 4x
faster for one token (58 against 246 us) but 2.4x slower for 128 (1.66 against 0.69 ms) and 10x
slower in float16/float32, so the dense path stays.

Example:
    >>> install()  # doctest: +SKIP
    >>> weight = quantize_weight(torch.randn(64, 128, dtype=torch.bfloat16), "int8")  # doctest: +SKIP
    >>> torch.nn.functional.linear(torch.ones(2, 128, dtype=torch.bfloat16), weight).shape  # doctest: +SKIP
    torch.Size([2, 64])
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torchao.quantization import Int8Tensor

from workbench.big_modeling.quantization.dense_buffers import dense_buffer

__all__ = ["install", "linear_int8_cpu", "runs_dense"]

_LINEARS = (torch.nn.functional.linear, torch.ops.aten.linear.default)
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # not a tensor subclass with its own dispatch


def runs_dense(weight: Any) -> bool:
    """Whether ``weight`` is an ``Int8Tensor`` that ``linear_int8_cpu`` runs when it is on the
    CPU: 2-D, weight-only (no activation quantization or pre-scale), one scale per row."""
    return (
        isinstance(weight, Int8Tensor)
        and weight.qdata.dim() == 2
        and weight.act_quant_kwargs is None
        and weight.act_pre_scale is None
        and tuple(weight.block_size) == (1, weight.qdata.shape[-1])
    )


def linear_int8_cpu(
    activation: torch.Tensor, weight: Int8Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``linear(activation, weight, bias)`` for a ``runs_dense`` CPU weight: cast into this
    thread's buffer, one ``mm``, the per-row scale and the bias applied in place."""
    dtype = activation.dtype
    rows, columns = weight.qdata.shape
    dense = dense_buffer(rows * columns, dtype).view(rows, columns).copy_(weight.qdata)
    out = torch.mm(activation.reshape(-1, columns), dense.t())
    out.mul_(weight.scale.to(dtype).flatten())
    if bias is not None:
        out.add_(bias)
    return out.reshape(*activation.shape[:-1], rows)


def _in_front_of(original: Any) -> Any:
    @functools.wraps(original)
    def linear(func: Any, types: Any, args: Any, kwargs: Any) -> torch.Tensor:
        activation, weight = args[0], args[1]
        bias = args[2] if len(args) > 2 else (kwargs or {}).get("bias")
        plain = type(activation) in _PLAIN and (bias is None or type(bias) in _PLAIN)
        on_cpu = activation.device.type == "cpu" and weight.device.type == "cpu"
        if plain and on_cpu and runs_dense(weight):
            return linear_int8_cpu(activation, weight, bias)
        return original(func, types, args, kwargs)

    linear.workbench_int8_cpu = True  # type: ignore[attr-defined]
    return linear


def install() -> bool:
    """Put ``linear_int8_cpu`` in front of torchao's linear for ``Int8Tensor`` (once: a later
    call finds it there and does nothing). ``False`` when torchao's dispatch tables are not where 0.18 keeps them:
    its own function then runs, with its per-call copies."""
    tables = (
        getattr(Int8Tensor, "_TORCH_FN_TABLE", {}).get(Int8Tensor, {}),
        getattr(Int8Tensor, "_ATEN_OP_TABLE", {}).get(Int8Tensor, {}),
    )
    found = [(table, op) for table in tables for op in _LINEARS if op in table]
    if len(found) != 2:
        return False
    for table, op in found:
        if not getattr(table[op], "workbench_int8_cpu", False):
            table[op] = _in_front_of(table[op])
    return True
