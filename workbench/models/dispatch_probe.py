"""What one eager forward costs the host beyond its arithmetic, measured on this machine.

An eager PyTorch forward pays, per module call, Python and the dispatcher (and on a GPU the
kernel launches) whatever its tensors' sizes. For a small model that is most of a decode step:
SmolLM2-135M (30 Llama layers, 257 MiB of bfloat16) decodes in 35 ms on this project's 2-core
CPU, 9.3 ms of which is the same model at 64-wide layers; the bandwidth model alone said 8 ms
in all. The speed model (``speed``) adds this host time per layer:

    dispatch_s(layer) = module calls in the layer x per_module_s
    per forward       + step_s (the model's wrapper: masks, cache, generate's loop)

Measured (``measure_dispatch_overhead``) by timing greedy ``generate`` decode steps of a tiny
bfloat16 Llama (64 wide, transformers' own classes) with 2 and with 10 layers, the arithmetic
negligible at that width and its Linears' matmuls left out (each returns a kept zero output:
the matmul curve, ``matmul_probe``, times each matmul call whole, its fixed cost included, and
the 64-wide matmuls were a third of the old per-module figure, counted twice):
``per_layer = (t10 - t2) / 8``, ``per_module_s = per_layer / module calls per layer`` (leaf
modules: 10 for Llama), ``step_s = t2 - 2 per_layer - per_module_s x the modules outside the
layers``. The per-module figure carries the layer's other operations (rotary, views, the cache
update), so it is a per-leaf-module average for a transformer layer: on this CPU 21 us for the
bfloat16 Llama (35 us with its matmuls, revision 1); before that revision, 13 to 20 us across
GPT-2, Llama, Mistral, Qwen2 and Gemma 2/3 layers (float32), about twice that for MoE and
hybrid layers, far more for state-space layers run by transformers' reference scans (what the
speed model then under-predicts). Cached per CPU,
thread count and library versions in ``<cache dir>/dispatch-overhead.json``: about a second,
once per machine.

Example:
    >>> probe = cached_dispatch_overhead()  # doctest: +SKIP
    >>> round(probe.per_module_s * 1e6)  # microseconds per module call
    26
"""

from __future__ import annotations

import logging
import sys
import time
import types
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import torch
from torch import nn

from workbench.models.cache_dirs import cached_probe, workbench_cache_dir
from workbench.models.device_probe import cpu_kernel_cache_key
from workbench.models.machine_load import OtherLoad
from workbench.models.probe_process import measure_apart, probe_main

__all__ = [
    "DispatchOverhead",
    "cached_dispatch_overhead",
    "dispatch_cache_key",
    "dispatch_cache_path",
    "leaf_module_count",
    "measure_dispatch_overhead",
    "measure_dispatch_overhead_apart",
    "skip_matmul",
]

logger = logging.getLogger(__name__)

PROBE_WIDTH: Final = 64
PROBE_LAYERS: Final = (2, 10)
DISPATCH_REVISION: Final = 2
"""In the cache key: r2's Linears leave their matmuls out (the matmul curve counts them)."""


@dataclass(frozen=True)
class DispatchOverhead:
    """The host's cost of an eager forward beyond its arithmetic (module docs).

    Attributes:
        per_module_s: seconds per module call, a transformer layer's average per leaf module.
        step_s: seconds per forward outside the layers and their modules.
        threads: torch intra-op threads during the measurement.
        measured_at: UNIX time of the measurement (or of a later one that did not replace it).
        others_busy: the share of the machine other processes took while it timed
            (``machine_load``; ``None``: not known).
    """

    per_module_s: float
    step_s: float
    threads: int
    measured_at: float
    others_busy: float | None = None


def leaf_module_count(module: nn.Module) -> int:
    """Modules without children under ``module`` (itself when it has none)."""
    return sum(1 for child in module.modules() if next(child.children(), None) is None)


def _probe_model(layers: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 (slow import)

    config = LlamaConfig(
        hidden_size=PROBE_WIDTH,
        intermediate_size=2 * PROBE_WIDTH,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=layers,
        vocab_size=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    for module in model.modules():
        if isinstance(module, nn.Linear):
            skip_matmul(module)
    return model


def skip_matmul(linear: nn.Linear) -> None:
    """Make ``linear``'s forward return a zero output of its shape, kept for the next call, in
    place of its matmul (the matmul, its output's allocation included, is the matmul curve's);
    ``del linear.forward`` restores it."""
    linear.forward = types.MethodType(_output_without_matmul, linear)


def _output_without_matmul(module: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    shape = (*hidden.shape[:-1], module.out_features)
    kept = module.__dict__.get("_probe_output")
    if kept is None or kept.shape != shape:
        kept = module.__dict__["_probe_output"] = hidden.new_zeros(shape)
    return kept


def _generate_s(model: nn.Module, new_tokens: int) -> float:
    """Seconds of one greedy ``generate`` of exactly ``new_tokens`` tokens."""
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    start = time.perf_counter()
    model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
    )
    return time.perf_counter() - start


def measure_dispatch_overhead(repeats: int = 5, short: int = 4, long: int = 36) -> DispatchOverhead:
    """Time the tiny Llama's decode steps at 2 and 10 layers (module docs) and derive the
    per-module and per-forward host costs. A decode step is the difference of ``generate``
    with ``long`` and ``short`` new tokens over the extra steps (the prompt's forward and
    generate's set-up cancel); each of the four timings is the best of ``repeats``, taken
    round-robin so background load hits all alike. About a second on two cores.

    Raises:
        RuntimeError: from torch or transformers, or a measurement drowned by other load
            (the larger model not slower): nothing is cached then.
    """
    few, many = PROBE_LAYERS
    models = {layers: _probe_model(layers) for layers in PROBE_LAYERS}
    best = {(layers, n): float("inf") for layers in PROBE_LAYERS for n in (short, long)}
    with torch.inference_mode():
        for model in models.values():
            _generate_s(model, short)  # warm-up: first-call kernel and cache set-up
        with OtherLoad() as load:
            for _ in range(repeats):
                for key, fastest in best.items():
                    best[key] = min(fastest, _generate_s(models[key[0]], key[1]))
    step = {
        layers: (best[layers, long] - best[layers, short]) / (long - short) for layers in models
    }
    per_layer = (step[many] - step[few]) / (many - few)
    if per_layer <= 0:
        raise RuntimeError(
            f"dispatch probe inconclusive: a {many}-layer decode step took "
            f"{step[many] * 1e3:.3f} ms, a {few}-layer one {step[few] * 1e3:.3f} ms"
        )
    small = models[few]
    layer_modules = leaf_module_count(small.model.layers[0])
    per_module = per_layer / layer_modules
    outside = leaf_module_count(small) - few * layer_modules
    return DispatchOverhead(
        per_module_s=per_module,
        step_s=max(step[few] - few * per_layer - outside * per_module, 0.0),
        threads=torch.get_num_threads(),
        measured_at=time.time(),
        others_busy=load.share,
    )


def measure_dispatch_overhead_apart() -> DispatchOverhead:
    """``measure_dispatch_overhead`` in a fresh process (``probe_process``) at this process's
    thread count, away from a worker's loaded model and threads.

    Raises:
        RuntimeError: the probe process failed.
    """
    return measure_apart("workbench.models.dispatch_probe", DispatchOverhead, "the dispatch probe")


def dispatch_cache_key() -> str:
    """The machine's key in the cache: the CPU, threads, libraries and the probe's revision."""
    return f"{cpu_kernel_cache_key()}, dispatch r{DISPATCH_REVISION}"


def dispatch_cache_path() -> Path:
    """``<workbench cache dir>/dispatch-overhead.json``."""
    return workbench_cache_dir() / "dispatch-overhead.json"


def cached_dispatch_overhead(
    measure: Callable[[], DispatchOverhead] | None = None,
    cache_path: Path | None = None,
    *,
    measure_if_missing: bool = True,
    again: bool = False,
) -> DispatchOverhead | None:
    """This machine's cached dispatch probe, else ``measure()``'s (default
    ``measure_dispatch_overhead``), written to the cache; ``None`` when nothing is cached and
    ``measure_if_missing`` is false or the measurement fails (the profile's typical values are
    used, with a note in the log). A malformed cache file or entry is measured again.
    ``again``: measured now, in place of the cached entry."""
    return cached_probe(
        cache_path or dispatch_cache_path(),
        "machines",
        dispatch_cache_key(),
        DispatchOverhead,
        measure or measure_dispatch_overhead_apart,
        measure_if_missing=measure_if_missing,
        again=again,
        what="dispatch overhead",
    )


if __name__ == "__main__":
    sys.exit(probe_main(lambda spec: asdict(measure_dispatch_overhead())))
