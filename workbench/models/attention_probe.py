"""How long a model's attention takes on this CPU by context length, measured for its shape.

A decode step's attention reads the whole KV cache; a prefill's attention compares every
prompt token with every earlier one. Neither follows the memory bandwidth or a FLOP rate on a
CPU: on this project's 2-core AVX-512 CPU one decode step of SmolLM2-135M's attention (9 query
heads over 3 K/V heads of 64, bfloat16) over 2,000 cached tokens takes 1.15 ms, the cache's
1.5 MB at 1.3 GB/s, where float32 reads it at 20 GB/s; and the rate depends on the head shape
(the same 2,000 tokens with 9 K/V heads: 3.0 ms). So the speed model (``speed``) times each
layer's attention on this curve, measured for the model's own shape:

    decode(C)  = the step's seconds with C cached tokens: linear through the two measured
                 contexts, its slope beyond them (the intercept is the call's fixed cost)
    prefill(P) = seconds of a causal attention over P tokens: a P + b P^2 through the two
                 measured lengths around P (a, b >= 0; the quadratic term is the attention
                 matrix), the first two below the first, the last two beyond the last

Measured (``measure_attention_times``) with the functions a model runs: the cache's
``torch.cat`` of the new token's K and V onto C tokens (what ``DynamicCache`` does each step)
and ``transformers``' ``sdpa_attention_forward`` for one query, without a mask, as a decode
step at batch 1 runs; a causal ``sdpa_attention_forward`` over P tokens for the prefill. Best
of a few calls after a warm-up; a fraction of a second per shape, in a fresh process
(``measure_attention_times_apart``), cached per CPU, thread count, library versions and shape
in ``<cache dir>/cpu-attention.json``.

Example:
    >>> shape = AttentionShape(heads=9, kv_heads=3, head_dim=64, v_head_dim=64, dtype="bfloat16")
    >>> times = cached_attention_times([shape])[shape.key]  # doctest: +SKIP
    >>> round(times.decode_seconds(2000) * 1e3, 2)  # doctest: +SKIP
    1.15
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import torch

from workbench.big_modeling.dtypes import to_dtype
from workbench.models.cache_dirs import cached_probe, workbench_cache_dir
from workbench.models.device_probe import cpu_kernel_cache_key
from workbench.models.machine_load import OtherLoad
from workbench.models.probe_process import probe_main, run_probe_process

__all__ = [
    "DECODE_CONTEXTS",
    "PREFILL_TOKENS",
    "AttentionShape",
    "AttentionTimes",
    "attention_cache_path",
    "cached_attention_times",
    "measure_attention_times",
    "measure_attention_times_apart",
]

DECODE_CONTEXTS: Final = (512, 4096)
"""Cached tokens a decode step is timed over."""
PREFILL_TOKENS: Final = (256, 512, 1024, 2048)
"""Prompt lengths a causal prefill is timed over. Between 256 and 2048 the kernel's time is
no single ``a P + b P^2``: SmolLM2-135M's shape (bfloat16, 9/3 heads of 64) on this project's
CPU takes 4.7 ms at 496 tokens, where the curve through 256 and 2048 alone said 3.3 (and its
496-token TTFT was predicted 10% short)."""
ATTENTION_REVISION: Final = 2
"""In the cache key: r2 times the prefill at four lengths (two before), so a shape cached by
r1 is measured again."""


@dataclass(frozen=True)
class AttentionShape:
    """What one layer's attention computes on, as ``sdpa_attention_forward`` sees it.

    Attributes:
        heads: query heads.
        kv_heads: key/value heads (``heads`` for MHA and for MLA as transformers expands it).
        head_dim: width of each query and key head.
        v_head_dim: width of each value head.
        dtype: the dtype name the cache and the queries are in.
    """

    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    dtype: str

    @property
    def key(self) -> str:
        """The cache's name for the shape, e.g. ``"bfloat16 9/3 heads x 64/64"``."""
        return (
            f"{self.dtype} {self.heads}/{self.kv_heads} heads x {self.head_dim}/{self.v_head_dim}"
        )


@dataclass(frozen=True)
class AttentionTimes:
    """Measured attention seconds for one shape at batch 1 (module docs).

    Attributes:
        decode: ``[[cached tokens, seconds], ...]`` of one decode step, tokens increasing.
        prefill: ``[[prompt tokens, seconds], ...]`` of one causal prefill, tokens increasing.
        measured_at: UNIX time of the measurement.
        others_busy: the share of the machine other processes took while it timed
            (``machine_load``; ``None``: not known).
    """

    decode: list[list[float]]
    prefill: list[list[float]]
    measured_at: float
    others_busy: float | None = None

    def decode_seconds(self, context: int) -> float:
        """One decode step over ``context`` cached tokens: the line through the measured
        points, never below zero."""
        (low_c, low_s), (high_c, high_s) = self.decode[0], self.decode[-1]
        slope = max(high_s - low_s, 0.0) / max(high_c - low_c, 1.0)
        return max(low_s + slope * (context - low_c), 0.0)

    def prefill_seconds(self, tokens: int) -> float:
        """One causal prefill over ``tokens``: ``a P + b P^2`` through the two measured points
        around it (the first two below them, the last two beyond), ``a`` and ``b`` not
        negative."""
        points = self.prefill
        upper = next((i for i, (p, _) in enumerate(points) if tokens <= p), len(points) - 1)
        (low_p, low_s), (high_p, high_s) = points[max(upper - 1, 0)], points[max(upper, 1)]
        quadratic = max((high_s / high_p - low_s / low_p) / max(high_p - low_p, 1.0), 0.0)
        linear = max(low_s / low_p - quadratic * low_p, 0.0)
        return linear * tokens + quadratic * tokens * tokens


class _Attention(torch.nn.Module):
    """The attributes ``sdpa_attention_forward`` reads from a model's attention module."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.is_causal = True
        self.num_key_value_groups = groups


def measure_attention_times(
    shape: AttentionShape,
    contexts: Sequence[int] = DECODE_CONTEXTS,
    prompts: Sequence[int] = PREFILL_TOKENS,
    repeats: int = 5,
) -> AttentionTimes:
    """Time ``shape``'s decode step at each of ``contexts`` and its causal prefill at each of
    ``prompts`` (module docs), the best of ``repeats`` calls after a warm-up.

    Raises:
        RuntimeError: from torch (a shape its kernels reject, out of memory).
    """
    from transformers.integrations.sdpa_attention import (  # noqa: PLC0415
        sdpa_attention_forward,
    )

    dtype = to_dtype(shape.dtype)
    module = _Attention(max(shape.heads // max(shape.kv_heads, 1), 1))
    scaling = shape.head_dim**-0.5
    generator = torch.Generator().manual_seed(0)

    def tensor(heads: int, tokens: int, width: int) -> torch.Tensor:
        return torch.randn(1, heads, tokens, width, generator=generator).to(dtype)

    def best(call: Any, rounds: int) -> float:
        call()
        fastest = math.inf
        for _ in range(rounds):
            start = time.perf_counter()
            call()
            fastest = min(fastest, time.perf_counter() - start)
        return fastest

    decode: list[list[float]] = []
    prefill: list[list[float]] = []
    with torch.inference_mode(), OtherLoad() as load:
        for context in contexts:
            keys = tensor(shape.kv_heads, context, shape.head_dim)
            values = tensor(shape.kv_heads, context, shape.v_head_dim)
            new_key = tensor(shape.kv_heads, 1, shape.head_dim)
            new_value = tensor(shape.kv_heads, 1, shape.v_head_dim)
            query = tensor(shape.heads, 1, shape.head_dim)

            def step(
                keys: torch.Tensor = keys,
                values: torch.Tensor = values,
                new_key: torch.Tensor = new_key,
                new_value: torch.Tensor = new_value,
                query: torch.Tensor = query,
            ) -> None:
                cached_keys = torch.cat([keys, new_key], dim=-2)
                cached_values = torch.cat([values, new_value], dim=-2)
                sdpa_attention_forward(
                    module, query, cached_keys, cached_values, None, scaling=scaling
                )

            decode.append([float(context), best(step, repeats)])
        for tokens in prompts:
            query = tensor(shape.heads, tokens, shape.head_dim)
            keys = tensor(shape.kv_heads, tokens, shape.head_dim)
            values = tensor(shape.kv_heads, tokens, shape.v_head_dim)

            def forward(
                query: torch.Tensor = query,
                keys: torch.Tensor = keys,
                values: torch.Tensor = values,
            ) -> None:
                sdpa_attention_forward(module, query, keys, values, None, scaling=scaling)

            prefill.append([float(tokens), best(forward, max(2, repeats // 2))])
    return AttentionTimes(
        decode=decode, prefill=prefill, measured_at=time.time(), others_busy=load.share
    )


def measure_attention_times_apart(shape: AttentionShape) -> AttentionTimes:
    """``measure_attention_times`` in a fresh process (``probe_process``) at this process's
    thread count: a worker's other threads would hold the GIL between the timed calls.

    Raises:
        RuntimeError: the probe process failed.
    """
    answer = run_probe_process(
        "workbench.models.attention_probe",
        {"threads": torch.get_num_threads(), "shape": asdict(shape)},
        what=f"the CPU attention probe ({shape.key})",
    )
    return AttentionTimes(**answer)


def attention_cache_path() -> Path:
    """``<workbench cache dir>/cpu-attention.json``."""
    return workbench_cache_dir() / "cpu-attention.json"


def cached_attention_times(
    shapes: Iterable[AttentionShape],
    *,
    measure_if_missing: bool = True,
    cache_path: Path | None = None,
) -> dict[str, AttentionTimes]:
    """This CPU's attention times for each of ``shapes`` by ``AttentionShape.key``: cached,
    else measured apart and cached; a shape that is not cached (``measure_if_missing``
    false) or whose probe fails is left out (the speed model then counts its FLOPs and
    bytes)."""
    found: dict[str, AttentionTimes] = {}
    for shape in dict.fromkeys(shapes):
        times = cached_probe(
            cache_path or attention_cache_path(),
            "machines",
            f"{cpu_kernel_cache_key()}; r{ATTENTION_REVISION}; {shape.key}",
            AttentionTimes,
            lambda shape=shape: measure_attention_times_apart(shape),
            measure_if_missing=measure_if_missing,
            what="CPU attention",
        )
        if times is not None:
            found[shape.key] = times
    return found


def _probe(spec: dict[str, Any]) -> dict[str, Any]:
    return asdict(measure_attention_times(AttentionShape(**spec["shape"])))


if __name__ == "__main__":
    sys.exit(probe_main(_probe))
