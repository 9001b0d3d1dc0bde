"""How long one decode matmul takes on this CPU by the size of its weight, measured.

A one-token matmul on the CPU reads its weight once, but small weights never reach the
memory's bandwidth: each call pays the kernel's set-up, its threads' wake-up and, in bfloat16
and float16, the conversion of the weight's blocks. On this project's 2-core CPU a 192 x 576
bfloat16 weight (221 KB) takes 75 us, where its bytes at the 22 GB/s a 32 MB weight reaches
would take 10 us; SmolLM2-135M's 210 layer matmuls per token take 24 ms, three times what a
single bandwidth says. The speed model (``speed``) therefore reads a plain Linear weight that
runs on the CPU in the time this curve gives for its bytes and dtype:

    seconds(W) = piecewise linear in W between the measured points (bytes, seconds);
                 below the smallest, proportional to it; above the largest, its last slope

Measured (``measure_matmul_curve``) as the CPU kernel probe does (``device_probe``): a
``(1, in)`` activation through square weights of each size and dtype, each timed matmul after
a 64 MiB cache flush (decode reads weights from memory), rounds round-robin over the sizes,
each point the best of its rounds. About four seconds; cached per CPU, thread count and
library versions in ``<cache dir>/cpu-matmul-curve.json``.

The same probe times a prefill's matmul per dtype, ``PREFILL_ROWS`` tokens through a
``PREFILL_SIDE``-square weight (best of its rounds), as FLOP/s (``prefill_flops``): the speed
model's prefill compute on the CPU. Nominal peaks say nothing of it: this project's 2-core AVX2
CPU, which has no bfloat16 arithmetic, ran SmolLM2-135M's 110-token bf16 prefill in 1.70 s,
where 0.5 TFLOP/s at 50% utilisation predicted 0.17 s. A cache entry from before this figure
is measured again.

And it times the same weights stored input-major, ``(in, out)``, as ``x @ W`` (``addmm``:
``transformers``' ``Conv1D``, GPT-2's layers), ``transposed_points``: in bfloat16 and float16
this CPU's kernels take 12-24x the ``linear`` time for that layout (a 768 x 3072 float16
weight: 5.5 ms against 0.23 ms; float32 alike), which made GPT-2's decode 4.7x slower than
predicted.

Example:
    >>> curve = cached_matmul_curve()  # doctest: +SKIP
    >>> round(curve.seconds(221_184, "bfloat16") * 1e6)  # microseconds for 192 x 576 bf16
    71
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Final

import torch

from workbench.big_modeling.dtypes import to_dtype
from workbench.models.cache_dirs import cached_probe, workbench_cache_dir
from workbench.models.device_probe import MIB, cpu_kernel_cache_key
from workbench.models.machine_load import OtherLoad
from workbench.models.probe_process import measure_apart, probe_main

__all__ = [
    "CURVE_DTYPES",
    "CURVE_SIZES",
    "MatmulCurve",
    "cached_matmul_curve",
    "matmul_curve_cache_path",
    "measure_matmul_curve",
    "measure_matmul_curve_apart",
    "measure_prefill_flops",
]

CURVE_DTYPES: Final = ("bfloat16", "float16", "float32")
CURVE_SIZES: Final = (32 * 1024, 256 * 1024, MIB, 4 * MIB, 16 * MIB)
"""Weight bytes measured: from a 64-wide projection's to a large model's MLP weight."""
PREFILL_ROWS: Final = 128
PREFILL_SIDE: Final = 1024


@dataclass(frozen=True)
class MatmulCurve:
    """One-token matmul seconds by weight bytes, per dtype (module docs).

    Attributes:
        points: ``{dtype name: [[weight bytes, seconds], ...]}``, bytes increasing.
        threads: torch intra-op threads during the measurement.
        measured_at: UNIX time of the measurement.
        prefill_flops: ``{dtype name: FLOP/s}`` of a ``PREFILL_ROWS``-token matmul.
        transposed_points: ``points`` for weights stored ``(in, out)``, read by ``x @ W``.
        others_busy: the share of the machine other processes took while it timed
            (``machine_load``; ``None``: not known).
    """

    points: dict[str, list[list[float]]]
    threads: int
    measured_at: float
    prefill_flops: dict[str, float] = field(default_factory=dict)
    transposed_points: dict[str, list[list[float]]] = field(default_factory=dict)
    others_busy: float | None = None

    @property
    def complete(self) -> bool:
        """Whether it has every figure this version measures (an older cache entry lacks
        some: it is measured again)."""
        return bool(self.points and self.prefill_flops and self.transposed_points)

    def seconds(self, nbytes: int, dtype: str, *, transposed: bool = False) -> float | None:
        """The curve's seconds for one matmul reading ``nbytes`` of ``dtype`` weight
        (``transposed``: stored ``(in, out)``); ``None`` for a dtype it has no points for."""
        points = (self.transposed_points if transposed else self.points).get(dtype)
        if not points or nbytes <= 0:
            return None if not points else 0.0
        first_bytes, first_s = points[0]
        if nbytes <= first_bytes:
            return first_s * nbytes / first_bytes
        for (low_bytes, low_s), (high_bytes, high_s) in pairwise(points):
            if nbytes <= high_bytes:
                share = (nbytes - low_bytes) / (high_bytes - low_bytes)
                return low_s + share * (high_s - low_s)
        if len(points) == 1:
            return first_s * nbytes / first_bytes
        (low_bytes, low_s), (high_bytes, high_s) = points[-2], points[-1]
        slope = max(high_s - low_s, 0.0) / (high_bytes - low_bytes)
        return high_s + slope * (nbytes - high_bytes)


def measure_matmul_curve(
    dtypes: Sequence[str] = CURVE_DTYPES,
    sizes: Sequence[int] = CURVE_SIZES,
    weights: int = 3,
    repeats: int = 5,
) -> MatmulCurve:
    """Time cold one-token matmuls through ``weights`` square weights per size and dtype
    (module docs).

    Raises:
        RuntimeError: from torch (out of memory).
    """
    from torch.nn.functional import linear  # noqa: PLC0415

    generator = torch.Generator().manual_seed(0)
    cases: list[tuple[str, bool, int, list[torch.Tensor], torch.Tensor]] = []
    for name in dtypes:
        dtype = to_dtype(name)
        element = torch.empty((), dtype=dtype).element_size()
        for nbytes in sizes:
            side = max(1, math.isqrt(nbytes // element))
            tensors = [
                (torch.randn(side, side, generator=generator) * 0.02).to(dtype)
                for _ in range(weights)
            ]
            activation = torch.randn(1, side, generator=generator).to(dtype)
            cases.append((name, False, side * side * element, tensors, activation))
            # (in, out) storage, read as x @ W: one weight (slow kernels: up to 80 ms a call)
            stored = [tensors[0].t().contiguous()]
            cases.append((name, True, side * side * element, stored, activation))
    flush = torch.empty(64 * MIB, dtype=torch.uint8)
    best = [[math.inf] * len(tensors) for _, _, _, tensors, _ in cases]

    def run(transposed: bool, activation: torch.Tensor, weight: torch.Tensor) -> None:
        if transposed:
            torch.matmul(activation, weight)
        else:
            linear(activation, weight)

    with torch.inference_mode():
        for _, transposed, _, tensors, activation in cases:  # warm-up: first-call set-up
            for weight in tensors:
                run(transposed, activation, weight)
        with OtherLoad() as load:
            for round_index in range(repeats):
                for case_index, (_, transposed, _, tensors, activation) in enumerate(cases):
                    for index, weight in enumerate(tensors):
                        flush.fill_(round_index)
                        start = time.perf_counter()
                        run(transposed, activation, weight)
                        seconds = time.perf_counter() - start
                        best[case_index][index] = min(best[case_index][index], seconds)
    points: dict[str, list[list[float]]] = {}
    transposed_points: dict[str, list[list[float]]] = {}
    for (name, transposed, nbytes, _, _), times in zip(cases, best, strict=True):
        table = transposed_points if transposed else points
        table.setdefault(name, []).append([float(nbytes), sum(times) / len(times)])
    return MatmulCurve(
        points=points,
        threads=torch.get_num_threads(),
        measured_at=time.time(),
        prefill_flops=measure_prefill_flops(dtypes, repeats=repeats),
        transposed_points=transposed_points,
        others_busy=load.share,
    )


def measure_prefill_flops(
    dtypes: Sequence[str] = CURVE_DTYPES,
    rows: int = PREFILL_ROWS,
    side: int = PREFILL_SIDE,
    repeats: int = 5,
) -> dict[str, float]:
    """FLOP/s of a ``(rows, side)`` activation through a ``side``-square weight per dtype,
    the best of ``repeats`` calls after a warm-up (module docs)."""
    from torch.nn.functional import linear  # noqa: PLC0415

    generator = torch.Generator().manual_seed(0)
    rates: dict[str, float] = {}
    with torch.inference_mode():
        for name in dtypes:
            dtype = to_dtype(name)
            weight = (torch.randn(side, side, generator=generator) * 0.02).to(dtype)
            activation = torch.randn(rows, side, generator=generator).to(dtype)
            linear(activation, weight)
            fastest = math.inf
            for _ in range(repeats):
                start = time.perf_counter()
                linear(activation, weight)
                fastest = min(fastest, time.perf_counter() - start)
            rates[name] = 2.0 * rows * side * side / max(fastest, 1e-9)
    return rates


def measure_matmul_curve_apart() -> MatmulCurve:
    """``measure_matmul_curve`` in a fresh process (``probe_process``) at this process's
    thread count: a worker's other threads would hold the GIL between the timed calls (in a
    loaded worker, 2 ms for a 32 KB matmul that takes 79 us).

    Raises:
        RuntimeError: the probe process failed.
    """
    return measure_apart("workbench.models.matmul_probe", MatmulCurve, "the CPU matmul probe")


def matmul_curve_cache_path() -> Path:
    """``<workbench cache dir>/cpu-matmul-curve.json``."""
    return workbench_cache_dir() / "cpu-matmul-curve.json"


def cached_matmul_curve(
    measure: Callable[[], MatmulCurve] | None = None,
    cache_path: Path | None = None,
    *,
    measure_if_missing: bool = True,
    again: bool = False,
) -> MatmulCurve | None:
    """This CPU's cached matmul curve, else ``measure()``'s (default
    ``measure_matmul_curve``), written to the cache; ``None`` when nothing is cached and
    ``measure_if_missing`` is false or the measurement fails (the speed model then uses the
    CPU's bandwidth alone). ``again``: measured now, in place of the cached entry. An entry
    that is not ``complete`` (cached before some figure existed) counts as missing."""

    def probe(again: bool) -> MatmulCurve | None:
        return cached_probe(
            cache_path or matmul_curve_cache_path(),
            "machines",
            cpu_kernel_cache_key(),
            MatmulCurve,
            measure or measure_matmul_curve_apart,
            measure_if_missing=measure_if_missing,
            again=again,
            what="CPU matmul curve",
        )

    curve = probe(again)
    if curve is not None and not curve.complete and measure_if_missing:
        curve = probe(True)
    return curve if curve is not None and curve.complete else None


if __name__ == "__main__":
    sys.exit(probe_main(lambda spec: asdict(measure_matmul_curve())))
