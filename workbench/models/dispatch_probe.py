"""What one eager forward costs the host beyond its arithmetic, measured on this machine.

An eager PyTorch forward pays, per module call, Python and the dispatcher (and on a GPU the
kernel launches) whatever its tensors' sizes. For a small model that is most of a decode step:
SmolLM2-135M (30 Llama layers, 257 MiB of bfloat16) decodes in 35 ms on this project's 2-core
CPU, 9.3 ms of which is the same model at 64-wide layers; the bandwidth model alone said 8 ms
in all. The speed model (``speed``) adds this host time per layer:

    dispatch_s(layer) = module calls in the layer x per_module_s
    per forward       + step_s (the model's wrapper: masks, cache, generate's loop)

Measured (``measure_dispatch_overhead``) by timing greedy ``generate`` decode steps of a tiny
bfloat16 Llama (64 wide, transformers' own classes) with 2 and with 6 layers, the arithmetic
negligible at that width: ``per_layer = (t6 - t2) / 4``, ``per_module_s = per_layer / module
calls per layer`` (leaf modules: 10 for Llama), ``step_s = t2 - 2 per_layer - per_module_s x
the modules outside the layers``. The per-module figure carries the layer's other operations
(rotary, views, the cache update), so it is a per-leaf-module average for a transformer
layer: on this CPU 13 to 20 us across GPT-2, Llama, Mistral, Qwen2 and Gemma 2/3 layers
(float32), about twice that for MoE and hybrid layers, far more for state-space layers run by
transformers' reference scans (what the speed model then under-predicts). Cached per CPU,
thread count and library versions in ``<cache dir>/dispatch-overhead.json``: about a second,
once per machine.

Example:
    >>> probe = cached_dispatch_overhead()  # doctest: +SKIP
    >>> round(probe.per_module_s * 1e6)  # microseconds per module call
    26
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import torch
from torch import nn

from workbench.models.cache_dirs import cached_probe, workbench_cache_dir
from workbench.models.device_probe import cpu_kernel_cache_key

__all__ = [
    "DispatchOverhead",
    "cached_dispatch_overhead",
    "dispatch_cache_path",
    "leaf_module_count",
    "measure_dispatch_overhead",
]

logger = logging.getLogger(__name__)

PROBE_WIDTH: Final = 64
PROBE_LAYERS: Final = (2, 6)


@dataclass(frozen=True)
class DispatchOverhead:
    """The host's cost of an eager forward beyond its arithmetic (module docs).

    Attributes:
        per_module_s: seconds per module call, a transformer layer's average per leaf module.
        step_s: seconds per forward outside the layers and their modules.
        threads: torch intra-op threads during the measurement.
        measured_at: UNIX time of the measurement.
    """

    per_module_s: float
    step_s: float
    threads: int
    measured_at: float


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
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def _decode_step_s(model: nn.Module, repeats: int, short: int = 4, long: int = 36) -> float:
    """Best-of-``repeats`` seconds per greedy decode step: the difference of two ``generate``
    calls (``short`` and ``long`` new tokens, neither allowed to stop early) over the extra
    steps, so the prompt's forward and generate's set-up cancel."""
    ids = torch.tensor([[3, 4, 5, 6, 7]])

    def timed(new_tokens: int) -> float:
        start = time.perf_counter()
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
        )
        return time.perf_counter() - start

    with torch.inference_mode():
        timed(short)  # warm-up: first-call kernel and cache set-up
        best = min(timed(long) - timed(short) for _ in range(repeats))
    return max(best, 0.0) / (long - short)


def measure_dispatch_overhead(repeats: int = 5) -> DispatchOverhead:
    """Time the tiny Llama's decode steps at 2 and 6 layers (module docs) and derive the
    per-module and per-forward host costs. About a second on two cores.

    Raises:
        RuntimeError: from torch or transformers.
    """
    few, many = PROBE_LAYERS
    small, large = _probe_model(few), _probe_model(many)
    rounds = [(_decode_step_s(small, 1), _decode_step_s(large, 1)) for _ in range(repeats)]
    short = min(pair[0] for pair in rounds)  # round-robin: background load hits both alike
    long_ = min(pair[1] for pair in rounds)
    per_layer = max(long_ - short, 0.0) / (many - few)
    layer_modules = leaf_module_count(small.model.layers[0])
    per_module = per_layer / layer_modules
    outside = leaf_module_count(small) - few * layer_modules
    step = max(short - few * per_layer - outside * per_module, 0.0)
    return DispatchOverhead(
        per_module_s=per_module,
        step_s=step,
        threads=torch.get_num_threads(),
        measured_at=time.time(),
    )


def dispatch_cache_path() -> Path:
    """``<workbench cache dir>/dispatch-overhead.json``."""
    return workbench_cache_dir() / "dispatch-overhead.json"


def cached_dispatch_overhead(
    measure: Callable[[], DispatchOverhead] | None = None,
    cache_path: Path | None = None,
    *,
    measure_if_missing: bool = True,
) -> DispatchOverhead | None:
    """This machine's cached dispatch probe, else ``measure()``'s (default
    ``measure_dispatch_overhead``), written to the cache; ``None`` when nothing is cached and
    ``measure_if_missing`` is false or the measurement fails (the profile's typical values are
    used, with a note in the log). A malformed cache file or entry is measured again."""
    return cached_probe(
        cache_path or dispatch_cache_path(),
        "machines",
        cpu_kernel_cache_key(),
        DispatchOverhead,
        measure or measure_dispatch_overhead,
        measure_if_missing=measure_if_missing,
        what="dispatch overhead",
    )
