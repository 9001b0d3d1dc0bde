"""The memory a CPU's matmul libraries keep after a model's forwards, probed per CPU.

torch's CPU matmuls keep buffers resident after their first call of some shapes: MKL's sgemm
packing buffers, per thread, in its own memory manager (float32); oneDNN's primitives and
scratchpads (float16 and bfloat16 on CPUs with AVX-512 FP16 or AMX). ``malloc_trim`` returns
none of them (issue 21, ``benchmarks/bench_cpu_gemm_workspace.py``). How much depends on the
CPU, the thread count, the libraries, and each call's dtype, shape, token count and order: from
0.05 MiB to 25 MiB for the same float32 weights on one machine, nothing on another for calls
that leave 4 MiB on the first; 5.7 MiB for a float16 run of an 8M-parameter GPT-2 (27% of its
total) on one CPU and 0.1 MiB on another. No formula predicts that, so the run's calls are
replayed once in a fresh process and what stays resident is measured
(``probe_gemm_workspace``), cached per CPU, threads, library versions and calls
(``cpu_gemm_workspace_bytes``). A run's reconciliation adds it to the CPU's predicted reserve
(``memory_reconcile``).

The calls are the ``nn.Linear`` and ``transformers`` ``Conv1D`` (GPT-2's ``addmm``) forwards
with float32, float16 or bfloat16 weights of a model that runs on the CPU: the prefill at the
prompt's length, the output layer at one position when ``generate`` keeps one
(``logits_to_keep``), then the one-token decode steps. An nf4/fp4 or int8 weight on the CPU is
one of them: ``bnb4_cpu`` and ``int8_cpu`` dequantize it and run one dense matmul in its compute
dtype (on a 2-core AVX-512 BF16 EPYC, 5.3 MiB stay resident after an nf4 SmolLM2-135M run's
bfloat16 shapes; not replaying them left its first run 9.5% above the prediction). int4 and fp8
weights run other kernels and are not replayed.

Example:
    >>> calls = (GemmCall("linear", rows=13, in_features=256, out_features=4096, bias=True),)
    >>> cpu_gemm_workspace_bytes(calls) >= 0  # doctest: +SKIP
    True
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from workbench.big_modeling.dtypes import dtype_name, to_dtype
from workbench.models.cache_dirs import (
    read_measurement_cache,
    workbench_cache_dir,
    write_measurement_cache,
)
from workbench.models.device_probe import cpu_kernel_cache_key
from workbench.models.probe_process import probe_main, run_probe_process
from workbench.runtime.memory_prediction import main_device
from workbench.runtime.model_inputs import accepts
from workbench.runtime.runtime_warmup import warm_up_runtime

__all__ = [
    "GemmCall",
    "cpu_gemm_calls",
    "cpu_gemm_workspace_bytes",
    "gemm_workspace_cache_path",
    "probe_gemm_workspace",
]

logger = logging.getLogger(__name__)

PROBE_TENSOR_LIMIT = 256 * 2**20  # a probed weight or output larger than this is cut in rows
_CACHE_ENTRIES = 256  # the newest entries kept in the cache file
_PROBE_TIMEOUT_S = 300
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # the dense kernels replayed
_PROBE_PROCESS = "warmed up as a worker (runtime_warmup)"  # in the cache key: what it measured


@dataclass(frozen=True)
class GemmCall:
    """One matmul of a forward: ``rows`` tokens through a weight of ``dtype``.

    ``kind`` is ``"linear"`` (``x @ W.T``, ``nn.Linear``; ``W`` is out x in) or ``"addmm"``
    (``bias + x @ W``, ``transformers``' ``Conv1D``; ``W`` is in x out).
    """

    kind: Literal["linear", "addmm"]
    rows: int
    in_features: int
    out_features: int
    bias: bool
    dtype: str = "float32"


def _dense_shape_reader() -> Callable[[Any], tuple[int, ...] | None]:
    """A function giving the shape of the dense matmul a weight runs on the CPU: its own for a
    plain float32/float16/bfloat16 tensor, the dequantized one for a 2-D nf4/fp4 weight or a
    torchao int8 one (``bnb4_cpu`` and ``int8_cpu`` run them as one dense matmul in their
    compute dtype); ``None`` for any other (int4 and fp8 weights run other kernels)."""
    # a quantized weight exists only once its module was imported: no heavy import here
    bnb4 = sys.modules.get("workbench.big_modeling.quantization.bnb4")
    int8 = sys.modules.get("workbench.big_modeling.quantization.int8_cpu")

    def dense_shape(weight: Any) -> tuple[int, ...] | None:
        if weight is None or weight.dtype not in _DTYPES:
            return None
        if type(weight) in (nn.Parameter, torch.Tensor):
            return tuple(weight.shape)
        if bnb4 is not None and isinstance(weight, bnb4.Bnb4bitTensor):
            shape = tuple(weight.weight_shape)
            return shape if len(shape) == 2 else None
        if int8 is not None and int8.runs_dense(weight):
            return tuple(weight.shape)
        return None

    return dense_shape


def _module_call(
    module: nn.Module, conv1d: type, dense_shape: Callable[[Any], tuple[int, ...] | None]
) -> GemmCall | None:
    """The matmul ``module`` runs (``rows`` 0: set per step); ``None`` for any other module or
    a weight that runs no dense float32/float16/bfloat16 matmul (``dense_shape``)."""
    kind = "addmm" if isinstance(module, conv1d) else "linear"
    if kind == "linear" and not isinstance(module, nn.Linear):
        return None
    weight = getattr(module, "weight", None)
    shape = dense_shape(weight)
    if shape is None:
        return None
    bias = getattr(module, "bias", None) is not None
    first, second = (int(n) for n in shape)  # Conv1D: in x out; Linear: out x in
    in_f, out_f = (first, second) if kind == "addmm" else (second, first)
    return GemmCall(kind, 0, in_f, out_f, bias, dtype_name(weight.dtype))


def cpu_gemm_calls(
    model: nn.Module,
    device_map: Mapping[str, object],
    *,
    prompt_tokens: int,
    new_tokens: int,
) -> tuple[GemmCall, ...]:
    """The distinct matmuls a run of ``model`` makes on the CPU, in the order it makes them
    (first the prefill, then the decode steps); empty when a GPU runs the model (a map with a
    GPU runs its offloaded layers there).

    Args:
        model: the loaded model (offloaded weights may be on ``meta``: only shapes are read).
        device_map: the map it was dispatched with.
        prompt_tokens: the prompt's length (batch 1).
        new_tokens: tokens generated: the first by the prefill, one decode step for each other;
            ``0``: one forward of every position (no ``logits_to_keep``).
    """
    if main_device(device_map) != "cpu":
        return ()
    from transformers.pytorch_utils import Conv1D  # noqa: PLC0415 (transformers: at run time)

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    keeps_one = new_tokens > 0 and accepts(model, "logits_to_keep")
    steps = [max(1, prompt_tokens)] + ([1] if new_tokens > 1 else [])  # prefill, then decode
    dense_shape = _dense_shape_reader()
    matmuls = [
        (module, call)
        for module in model.modules()
        if (call := _module_call(module, Conv1D, dense_shape)) is not None
    ]
    calls: dict[GemmCall, None] = {}  # distinct, in the order they run
    for rows in steps:
        for module, call in matmuls:
            calls.setdefault(replace(call, rows=1 if keeps_one and module is head else rows))
    return tuple(calls)


# ------------------------------------------------------------------------------------------
# The probe: the calls replayed in a fresh process
# ------------------------------------------------------------------------------------------


def _probe_shape(call: GemmCall) -> tuple[int, int]:
    """Output columns and input columns the probe uses: the output dimension is cut so that
    neither the weight nor the output passes ``PROBE_TENSOR_LIMIT`` (the buffers measured are
    per-thread blocks of a few MiB, not whole weights)."""
    widest = max(call.in_features, call.rows, 1)
    out_f = max(1, min(call.out_features, PROBE_TENSOR_LIMIT // (4 * widest)))
    return out_f, call.in_features


def _run_calls(calls: Iterable[dict[str, Any]], measure: bool) -> int:
    """Run each call once; the anonymous bytes they left resident (after a heap trim), the
    tensors' own bytes left out."""
    from workbench.runtime.c_heap import release_free_heap  # noqa: PLC0415
    from workbench.runtime.memory_readings import read_anonymous_bytes  # noqa: PLC0415

    left = 0
    for raw in calls:
        call = GemmCall(**raw)
        out_f, in_f = _probe_shape(call)
        shape = (in_f, out_f) if call.kind == "addmm" else (out_f, in_f)
        dtype = to_dtype(call.dtype)
        weight = torch.randn(shape, dtype=dtype)
        bias = torch.randn(out_f, dtype=dtype) if call.bias else None
        x = torch.randn(call.rows, in_f, dtype=dtype)
        release_free_heap()
        before = read_anonymous_bytes() or 0
        if call.kind == "addmm":
            y = torch.addmm(bias, x, weight) if bias is not None else x @ weight
        else:
            y = nn.functional.linear(x, weight, bias)
        del y
        release_free_heap()
        after = read_anonymous_bytes() or 0
        if measure:
            left += max(0, after - before)
        del weight, bias, x
    return left


def _measure_spec(spec: dict[str, Any]) -> dict[str, int]:
    """The probe process's answer for ``{"threads", "warm", "calls"}``: the bytes ``calls``
    left resident after ``warm`` ran (not counted), in a process warmed up as a worker is
    before its loads (``runtime_warmup``: the pool threads' first matmuls are the runtime's)."""
    for dtype in {call["dtype"] for call in [*spec["warm"], *spec["calls"]]}:
        warm_up_runtime(None, to_dtype(dtype))
    _run_calls(spec["warm"], measure=False)
    return {"bytes": _run_calls(spec["calls"], measure=True)}


def probe_gemm_workspace(
    calls: Sequence[GemmCall], *, warm: Sequence[GemmCall] = (), threads: int | None = None
) -> int:
    """The anonymous bytes ``calls`` leave resident in a fresh process of this interpreter and
    environment, after ``warm`` ran there first (calls this worker already made: their buffers
    are in its baseline). ``threads``: this process's torch thread count by default.

    Raises:
        RuntimeError: the probe process failed or printed no figure.
    """
    spec = {
        "threads": threads or torch.get_num_threads(),
        "warm": [asdict(c) for c in warm],
        "calls": [asdict(c) for c in calls],
    }
    answer = run_probe_process(
        "workbench.runtime.gemm_workspace",
        spec,
        timeout_s=_PROBE_TIMEOUT_S,
        what="the matmul workspace probe",
    )
    return int(answer["bytes"])


# ------------------------------------------------------------------------------------------
# The cache
# ------------------------------------------------------------------------------------------


def gemm_workspace_cache_path() -> Path:
    """``<workbench cache dir>/cpu-gemm-workspace.json``."""
    return workbench_cache_dir() / "cpu-gemm-workspace.json"


def _cache_key(calls: Sequence[GemmCall], warm: Sequence[GemmCall]) -> str:
    """The CPU, threads and kernel libraries (``cpu_kernel_cache_key``), the CPU capability
    torch dispatches to, the BLAS/OpenMP and malloc settings of the environment (the worker's
    fixed mmap threshold, ``c_heap``, is one), and the calls."""
    settings = sorted(
        (name, value)
        for name, value in os.environ.items()
        if name.startswith(("MKL_", "OMP_", "KMP_", "MALLOC_"))
    )
    identity = {
        "machine": cpu_kernel_cache_key(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "settings": settings,
        "warm": [asdict(c) for c in warm],
        "calls": [asdict(c) for c in calls],
        "process": _PROBE_PROCESS,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def cpu_gemm_workspace_bytes(
    calls: Sequence[GemmCall],
    *,
    warm: Sequence[GemmCall] = (),
    cache_path: Path | None = None,
    measure: Callable[[Sequence[GemmCall], Sequence[GemmCall]], int] | None = None,
    before_measuring: Callable[[], None] | None = None,
) -> int | None:
    """What ``calls`` leave resident on this CPU after ``warm``: cached, else measured with
    ``measure(calls, warm)`` (default ``probe_gemm_workspace``; ``before_measuring()`` is
    called first) and cached. ``0`` for no calls; ``None`` when the probe fails (logged: the
    run's record says it was not probed).

    A malformed cache file or entry is measured again, never fatal.
    """
    if not calls:
        return 0
    path = cache_path or gemm_workspace_cache_path()
    key = _cache_key(calls, warm)
    entries = read_measurement_cache(path, "entries")
    cached = entries.get(key)
    if isinstance(cached, dict) and isinstance(cached.get("bytes"), int) and cached["bytes"] >= 0:
        return int(cached["bytes"])
    if before_measuring is not None:
        before_measuring()
    try:
        nbytes = (measure or (lambda c, w: probe_gemm_workspace(c, warm=w)))(calls, warm)
    except RuntimeError as exc:
        logger.warning("CPU matmul workspace not probed: %s", exc)
        return None
    entries.pop(key, None)
    entries[key] = {"bytes": int(nbytes), "calls": len(calls), "measured_at": time.time()}
    kept = dict(list(entries.items())[-_CACHE_ENTRIES:])
    try:
        write_measurement_cache(path, "entries", kept)
    except OSError as exc:
        logger.warning("CPU matmul workspace cache %s not written: %s", path, exc)
    return int(nbytes)


if __name__ == "__main__":
    sys.exit(probe_main(_measure_spec))
