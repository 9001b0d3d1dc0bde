"""How long one decode matmul takes on this CPU by the size of its weight, measured.

A one-token matmul on the CPU reads its weight once, but small weights never reach the
memory's bandwidth: each call pays the kernel's set-up, its threads' wake-up and, in bfloat16
and float16, the conversion of the weight's blocks. On this project's 2-core CPU a 256 KB
bfloat16 weight takes 40-45 us, where its bytes at the 18 GB/s a 16 MB weight reaches would
take 14 us. The speed model (``speed``) therefore reads a plain Linear weight that runs on the
CPU in the time this curve gives for its bytes and dtype:

    seconds(W) = piecewise linear in W between the measured points (bytes, seconds);
                 below the smallest, proportional to it; above the largest, its last slope

Measured (``measure_matmul_curve``) as a model's decode step runs its matmuls: a ``(1, in)``
activation through a stream of distinct square weights, ``STREAM_BYTES`` of them per dtype
(more than a CPU's last-level cache, so each is read from memory, as a model's are), the sizes
mixed in a seeded shuffle, back to back; each point the median call of its size over three
passes after an untimed one. Until revision 2 each call was timed alone after a 64 MiB cache
flush, which also left the kernel's threads idle and its code cold: a 32 KB bfloat16 weight
took 135 us that way and 20 us in a stream, 192 x 576 (221 KB) 75 us against 38, and
SmolLM2-135M's 210 layer matmuls were predicted at 35 ms a step where they take 23-29 ms.
Ten seconds in all; cached per CPU, thread count, library versions and revision in
``<cache dir>/cpu-matmul-curve.json``.

Inside a model's forward the same call takes longer than back to back: between a layer's
matmuls run its norms, rotary, cache update and attention, and each matmul pays for it
(``context_s``, per dtype, added to every call's curve time: ``call_seconds``). Measured
(``measure_context_seconds``) with a random SmolLM2-wide Llama of ``CONTEXT_LAYERS`` layers: a
decode step with its matmuls, the same step with each Linear returning a kept zero output, and
its layers' weights through ``linear`` back to back; the step's matmuls take ``full - without``,
and what that exceeds the stream by, per call, is ``context_s``. On this project's 2-core CPU
19-31 us in bfloat16, 10-17 us in float16, 15-38 us in float32: 25% of SmolLM2-135M's matmul
time, which the stream alone predicted 13-30% too fast.

The same probe times a prefill's matmul per dtype, ``PREFILL_ROWS`` tokens through a
``PREFILL_SIDE``-square weight (best of its rounds), as FLOP/s (``prefill_flops``): the speed
model's prefill compute on the CPU. Nominal peaks say nothing of it: this project's 2-core AVX2
CPU, which has no bfloat16 arithmetic, ran SmolLM2-135M's 110-token bf16 prefill in 1.70 s,
where 0.5 TFLOP/s at 50% utilisation predicted 0.17 s.

It times that matmul at ``PREFILL_ROW_POINTS`` tokens too (``prefill_rows_flops``): on this
project's CPU a bfloat16 matmul runs at 175 GFLOP/s with 8 rows, 320 with 32 and 418 with 128,
so a short prompt's forward is not a decode step's (5 tokens: 30% longer) nor a long prompt's
rate (the speed model takes the one-token time below the first point, rising linearly to it).

And it times the same weights stored input-major, ``(in, out)``, as ``x @ W`` (``addmm``:
``transformers``' ``Conv1D``, GPT-2's layers), ``transposed_points``: in float16 this CPU's
kernels take 8-20x the ``linear`` time for that layout (a 4 MB float16 weight: 2.2 ms against
0.2 ms), which made GPT-2's decode 4.7x slower than predicted. Its prefill rate too
(``transposed_prefill_rows_flops``, on a ``TRANSPOSED_PREFILL_SIDE``-square weight): float16
``addmm`` on that layout runs at 3.3 GFLOP/s at every row count, against 29-33 for ``linear``,
and GPT-2's 150-token TTFT took 6.1 s where the ``linear`` rate predicted 0.65.

Example:
    >>> curve = cached_matmul_curve()  # doctest: +SKIP
    >>> round(curve.seconds(262_088, "bfloat16") * 1e6)  # microseconds for 362 x 362 bf16
    43
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Final

import torch

from workbench.big_modeling.dtypes import to_dtype
from workbench.models.cache_dirs import cached_probe, workbench_cache_dir
from workbench.models.device_probe import MIB, cpu_kernel_cache_key
from workbench.models.dispatch_probe import random_llama, skip_matmul
from workbench.models.forward_arguments import cache_argument
from workbench.models.machine_load import OtherLoad
from workbench.models.probe_process import measure_apart, probe_main

__all__ = [
    "CURVE_DTYPES",
    "CURVE_SIZES",
    "MatmulCurve",
    "cached_matmul_curve",
    "matmul_curve_cache_key",
    "matmul_curve_cache_path",
    "measure_context_seconds",
    "measure_matmul_curve",
    "measure_matmul_curve_apart",
    "measure_prefill_flops",
]

CURVE_DTYPES: Final = ("bfloat16", "float16", "float32")
CURVE_SIZES: Final = (32 * 1024, 256 * 1024, MIB, 4 * MIB, 16 * MIB)
"""Weight bytes measured: from a 64-wide projection's to a large model's MLP weight."""
STREAM_BYTES: Final = 96 * MIB
"""Each timed stream's distinct weights: beyond a CPU's last-level cache, as a model's are."""
CURVE_REVISION: Final = 2
"""In the cache key: r2 times streams of distinct weights and the context (r1: each call after a
cache flush)."""
CONTEXT_WIDTH: Final = 576
CONTEXT_LAYERS: Final = 12
"""The Llama ``measure_context_seconds`` runs: SmolLM2-135M's width, 70 MB of 16-bit layers."""
PREFILL_ROWS: Final = 128
PREFILL_ROW_POINTS: Final = (8, 32, PREFILL_ROWS)
PREFILL_SIDE: Final = 1024
TRANSPOSED_PREFILL_SIDE: Final = 1000
"""Not a power of two: float16 ``addmm`` on ``(in, out)`` weights slows 3x at power-of-two
strides on this project's CPU (1.15 GFLOP/s at 1024, 3.3 at 1000 and 960, 2.6-3.3 at GPT-2's
768, 1280 and 1600, 2.1-3.1 for the 60M GPT-2 demo's 640-wide shapes)."""


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
        context_s: ``{dtype name: seconds}`` one matmul call adds inside a model's forward
            over the same call back to back (``measure_context_seconds``).
        prefill_rows_flops: ``{dtype name: [[rows, FLOP/s], ...]}``, rows increasing: the
            prefill matmul's rate at ``PREFILL_ROW_POINTS`` tokens (a short prompt's matmuls
            run far below a long one's: ``prefill_flops_at``).
        transposed_prefill_rows_flops: ``prefill_rows_flops`` for weights stored
            ``(in, out)``, through ``addmm`` as ``Conv1D`` runs them.
    """

    points: dict[str, list[list[float]]]
    threads: int
    measured_at: float
    prefill_flops: dict[str, float] = field(default_factory=dict)
    transposed_points: dict[str, list[list[float]]] = field(default_factory=dict)
    others_busy: float | None = None
    context_s: dict[str, float] = field(default_factory=dict)
    prefill_rows_flops: dict[str, list[list[float]]] = field(default_factory=dict)
    transposed_prefill_rows_flops: dict[str, list[list[float]]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Whether it has every figure this version measures (an older cache entry lacks
        some: it is measured again)."""
        return bool(
            self.points
            and self.prefill_flops
            and self.transposed_points
            and self.context_s
            and self.prefill_rows_flops
            and self.transposed_prefill_rows_flops
        )

    def prefill_flops_at(self, dtype: str, rows: int, *, transposed: bool = False) -> float | None:
        """The prefill matmul's FLOP/s at ``rows`` tokens (``transposed``: for weights stored
        ``(in, out)``): linear in rows between the measured points, the first point's below
        it, the last's above it; ``None`` without points for ``dtype``."""
        table = self.transposed_prefill_rows_flops if transposed else self.prefill_rows_flops
        points = table.get(dtype)
        if not points:
            return None
        if rows <= points[0][0]:
            return points[0][1]
        for (low_rows, low_rate), (high_rows, high_rate) in pairwise(points):
            if rows <= high_rows:
                return low_rate + (rows - low_rows) / (high_rows - low_rows) * (
                    high_rate - low_rate
                )
        return points[-1][1]

    def call_seconds(self, nbytes: int, dtype: str, *, transposed: bool = False) -> float | None:
        """One matmul call inside a model's forward: ``seconds`` plus ``context_s``."""
        seconds = self.seconds(nbytes, dtype, transposed=transposed)
        if seconds is None or nbytes <= 0:
            return seconds
        return seconds + self.context_s.get(dtype, 0.0)

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


def _stream(
    name: str, sizes: Sequence[int], stream_bytes: int, *, transposed: bool, seed: int
) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """Distinct square weights of each size, ``stream_bytes / len(sizes)`` of each (at least
    two), as ``(size index, weight, activation)`` in a seeded shuffled order: a model's mix."""
    dtype = to_dtype(name)
    element = torch.empty((), dtype=dtype).element_size()
    generator = torch.Generator().manual_seed(seed)
    stream = []
    for index, nbytes in enumerate(sizes):
        side = max(1, math.isqrt(nbytes // element))
        copies = max(2, math.ceil(stream_bytes / len(sizes) / (side * side * element)))
        activation = torch.randn(1, side, generator=generator).to(dtype)
        for _ in range(copies):
            weight = (torch.randn(side, side, generator=generator) * 0.02).to(dtype)
            stream.append((index, weight.t().contiguous() if transposed else weight, activation))
    order = torch.randperm(len(stream), generator=generator).tolist()
    return [stream[i] for i in order]


def _time_stream(
    stream: list[tuple[int, torch.Tensor, torch.Tensor]],
    count: int,
    *,
    transposed: bool,
    repeats: int,
) -> list[float]:
    """The median seconds of one call per size index, over ``repeats`` passes through
    ``stream`` after one untimed pass (first-call set-up)."""
    from torch.nn.functional import linear  # noqa: PLC0415

    times: list[list[float]] = [[] for _ in range(count)]
    for timed in [False] + [True] * repeats:
        for index, weight, activation in stream:
            start = time.perf_counter()
            if transposed:
                torch.matmul(activation, weight)
            else:
                linear(activation, weight)
            if timed:
                times[index].append(time.perf_counter() - start)
    return [statistics.median(each) for each in times]


def measure_matmul_curve(
    dtypes: Sequence[str] = CURVE_DTYPES,
    sizes: Sequence[int] = CURVE_SIZES,
    stream_bytes: int = STREAM_BYTES,
    repeats: int = 3,
) -> MatmulCurve:
    """Time one-token matmuls through streams of distinct weights per dtype and layout, each
    point the median call of its size (module docs).

    Raises:
        RuntimeError: from torch (out of memory).
    """
    points: dict[str, list[list[float]]] = {}
    transposed_points: dict[str, list[list[float]]] = {}
    with torch.inference_mode(), OtherLoad() as load:
        for seed, name in enumerate(dtypes):
            for transposed, table in ((False, points), (True, transposed_points)):
                stream = _stream(name, sizes, stream_bytes, transposed=transposed, seed=seed)
                seconds = _time_stream(stream, len(sizes), transposed=transposed, repeats=repeats)
                nbytes = {index: weight.nbytes for index, weight, _ in stream}
                del stream
                table[name] = [[float(nbytes[i]), each] for i, each in enumerate(seconds)]
    prefill_rows = {name: _row_rates(name, repeats) for name in dtypes}
    transposed_rows = {name: _row_rates(name, repeats, transposed=True) for name in dtypes}
    return MatmulCurve(
        points=points,
        threads=torch.get_num_threads(),
        measured_at=time.time(),
        prefill_flops={name: rows[-1][1] for name, rows in prefill_rows.items()},
        transposed_points=transposed_points,
        others_busy=load.share,
        context_s=measure_context_seconds(dtypes),
        prefill_rows_flops=prefill_rows,
        transposed_prefill_rows_flops=transposed_rows,
    )


def _decode_step_s(model: torch.nn.Module, steps: int) -> float:
    """The median seconds of a one-token forward after a 5-token prompt, over ``steps``."""
    from transformers import DynamicCache  # noqa: PLC0415

    cache, times = {cache_argument(model)[0]: DynamicCache()}, []
    prompt = torch.tensor([[3, 4, 5, 6, 7]])
    token = model(input_ids=prompt, logits_to_keep=1, **cache).logits[:, -1:].argmax(-1)
    for _ in range(steps):
        start = time.perf_counter()
        logits = model(input_ids=token, logits_to_keep=1, **cache).logits
        token = logits[:, -1:].argmax(-1)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_context_seconds(
    dtypes: Sequence[str] = CURVE_DTYPES,
    repeats: int = 3,
    steps: int = 8,
    width: int = CONTEXT_WIDTH,
    layers: int = CONTEXT_LAYERS,
) -> dict[str, float]:
    """Per dtype, the seconds one matmul call adds inside a model's decode step over the same
    call back to back: a random Llama's step with its layers' matmuls (``full``), without them
    (each Linear returns a kept zero output: ``without``), and its layers' weights run through
    ``linear`` back to back in their order (``stream``), each the best of ``repeats``, taken
    round-robin; ``max(full - without - stream, 0) / calls`` (module docs)."""
    from torch.nn.functional import linear  # noqa: PLC0415

    seconds: dict[str, float] = {}
    with torch.inference_mode():
        for name in dtypes:
            model = random_llama(to_dtype(name), width, layers)
            linears = [
                module
                for module_name, module in model.named_modules()
                if isinstance(module, torch.nn.Linear) and ".layers." in f".{module_name}"
            ]
            inputs = {
                width: torch.randn(1, 1, width).to(to_dtype(name))
                for width in {module.in_features for module in linears}
            }

            def stream(linears=linears, inputs=inputs) -> float:
                start = time.perf_counter()
                for module in linears:
                    linear(inputs[module.in_features], module.weight)
                return time.perf_counter() - start

            def without(model=model, linears=linears) -> float:
                for module in linears:
                    skip_matmul(module)
                try:
                    return _decode_step_s(model, steps)
                finally:
                    for module in linears:
                        del module.forward

            best = {"full": math.inf, "without": math.inf, "stream": math.inf}
            _decode_step_s(model, 2)  # first-call set-up
            stream()
            for _ in range(repeats):
                best["full"] = min(best["full"], _decode_step_s(model, steps))
                best["without"] = min(best["without"], without())
                best["stream"] = min(best["stream"], statistics.median(stream() for _ in range(3)))
            added = best["full"] - best["without"] - best["stream"]
            seconds[name] = max(added, 0.0) / len(linears)
            del model, linears, inputs
    return seconds


def _row_rates(name: str, repeats: int, *, transposed: bool = False) -> list[list[float]]:
    """``[[rows, FLOP/s], ...]`` of ``name``'s prefill matmul at ``PREFILL_ROW_POINTS`` (the
    last is ``PREFILL_ROWS``: ``prefill_flops`` is its rate), on the layout's probe weight."""
    side = TRANSPOSED_PREFILL_SIDE if transposed else PREFILL_SIDE
    return [
        [
            float(rows),
            measure_prefill_flops(
                (name,), rows=rows, side=side, repeats=repeats, transposed=transposed
            )[name],
        ]
        for rows in PREFILL_ROW_POINTS
    ]


def measure_prefill_flops(
    dtypes: Sequence[str] = CURVE_DTYPES,
    rows: int = PREFILL_ROWS,
    side: int = PREFILL_SIDE,
    repeats: int = 5,
    *,
    transposed: bool = False,
) -> dict[str, float]:
    """FLOP/s of a ``(rows, side)`` activation through a ``side``-square weight per dtype,
    the best of ``repeats`` calls after a warm-up (module docs); ``transposed``: the weight
    stored ``(in, out)``, through ``addmm`` with a bias as ``transformers``' ``Conv1D``."""
    from torch.nn.functional import linear  # noqa: PLC0415

    generator = torch.Generator().manual_seed(0)
    rates: dict[str, float] = {}
    with torch.inference_mode():
        for name in dtypes:
            dtype = to_dtype(name)
            weight = (torch.randn(side, side, generator=generator) * 0.02).to(dtype)
            activation = torch.randn(rows, side, generator=generator).to(dtype)
            call = (
                partial(
                    torch.addmm, torch.zeros(side, dtype=dtype), activation, weight.t().contiguous()
                )
                if transposed
                else partial(linear, activation, weight)
            )
            call()
            fastest = math.inf
            for _ in range(repeats):
                start = time.perf_counter()
                call()
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


def matmul_curve_cache_key() -> str:
    """The machine's key in the cache: the CPU, threads, libraries and the probe's revision."""
    return f"{cpu_kernel_cache_key()}, matmul curve r{CURVE_REVISION}"


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
            matmul_curve_cache_key(),
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
