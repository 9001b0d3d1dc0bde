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
speed model then under-predicts).

A prompt's forward also runs each layer's elementwise work (norms, rotary, the MLP's
activation, residual adds, the cache update) on every token, which a one-token decode step at
64 wide does not show: SmolLM2-135M's layers take 3.2 us a token for it on this CPU, 48 ms of
a 496-token prefill. It scales with the layer's width, as its activations do, so with the
square root of its parameters ``N``:

    elementwise_s(layer, T tokens) = T x elementwise_s x sqrt(N)

Measured (``measure_elementwise_seconds``) with ``ELEMENTWISE_WIDTH``-wide bfloat16 Llamas of 2
and 6 layers, their matmuls and their attention left out (``NO_ATTENTION``, a registered
attention implementation returning a kept zero output: ``attention_probe`` times attention),
each run over 1 and ``ELEMENTWISE_TOKENS`` tokens: the per-layer difference per extra token over
``sqrt(N)``. On this CPU 1.2-2.1 ns across measurements, and 1.7-1.9 ns for Llama layers 256,
576 and 2,048 wide in one run (2.9 at 1,024). Cached per CPU,
thread count and library versions in ``<cache dir>/dispatch-overhead.json``: about a second,
once per machine.

Example:
    >>> probe = cached_dispatch_overhead()  # doctest: +SKIP
    >>> round(probe.per_module_s * 1e6)  # microseconds per module call
    26
"""

from __future__ import annotations

import logging
import math
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
    "measure_elementwise_seconds",
    "random_llama",
    "skip_matmul",
]

logger = logging.getLogger(__name__)

PROBE_WIDTH: Final = 64
PROBE_LAYERS: Final = (2, 10)
DISPATCH_REVISION: Final = 3
"""In the cache key: r2's Linears leave their matmuls out (the matmul curve counts them); r3
measures the elementwise work per token (``elementwise_s``)."""
ELEMENTWISE_WIDTH: Final = 576
"""The width of the Llama whose elementwise work per token is timed (SmolLM2-135M's: 1,536
wide MLP, 9 heads over 3 K/V heads)."""
ELEMENTWISE_LAYER_PARAMS: Final = 3_540_096
"""Parameters of one of its layers (what ``elementwise_s`` is per square root of)."""
ELEMENTWISE_LAYERS: Final = (2, 6)
ELEMENTWISE_TOKENS: Final = 256
NO_ATTENTION: Final = "workbench_no_attention"
"""The attention implementation registered for the elementwise probe: a zero output of
attention's shape (``attention_probe`` times attention)."""


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
        elementwise_s: seconds of a layer's elementwise work per prompt token, per square
            root of its parameters (``measure_elementwise_seconds``).
    """

    per_module_s: float
    step_s: float
    threads: int
    measured_at: float
    others_busy: float | None = None
    elementwise_s: float = 0.0


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
        elementwise_s=measure_elementwise_seconds(repeats),
    )


def measure_elementwise_seconds(repeats: int = 5) -> float:
    """Seconds of a layer's elementwise work per prompt token, per square root of its
    parameters: ``ELEMENTWISE_WIDTH``-wide bfloat16 Llamas of ``ELEMENTWISE_LAYERS`` layers,
    their matmuls and attention left out, each run over 1 and ``ELEMENTWISE_TOKENS`` tokens
    (module docs; best of ``repeats``, round-robin); 0 when other load drowns it."""
    from transformers import AttentionInterface  # noqa: PLC0415 (slow import)

    AttentionInterface.register(NO_ATTENTION, _no_attention)
    few, many = ELEMENTWISE_LAYERS
    models = {layers: _wide_model(layers) for layers in ELEMENTWISE_LAYERS}
    prompts = {
        tokens: torch.arange(tokens).remainder(128)[None] for tokens in (1, ELEMENTWISE_TOKENS)
    }
    runs = [(layers, tokens) for layers in models for tokens in prompts]
    best = dict.fromkeys(runs, math.inf)
    with torch.inference_mode():
        for layers, tokens in runs:
            models[layers](prompts[tokens], logits_to_keep=1)  # warm-up
        for _ in range(repeats):
            for layers, tokens in runs:
                start = time.perf_counter()
                models[layers](prompts[tokens], logits_to_keep=1)
                seconds = time.perf_counter() - start
                best[layers, tokens] = min(best[layers, tokens], seconds)
    per_layer = {
        tokens: (best[many, tokens] - best[few, tokens]) / (many - few) for tokens in prompts
    }
    per_token = (per_layer[ELEMENTWISE_TOKENS] - per_layer[1]) / (ELEMENTWISE_TOKENS - 1)
    parameters = sum(p.numel() for p in models[few].model.layers[0].parameters())
    return max(per_token, 0.0) / math.sqrt(parameters)


def _wide_model(layers: int) -> nn.Module:
    """A random ``ELEMENTWISE_WIDTH``-wide bfloat16 Llama of ``layers`` layers whose Linears
    and attention compute nothing (``skip_matmul``, ``NO_ATTENTION``)."""
    model = random_llama(torch.bfloat16, ELEMENTWISE_WIDTH, layers)
    model.config._attn_implementation = NO_ATTENTION
    for module in model.modules():
        if isinstance(module, nn.Linear):
            skip_matmul(module)
    return model


def random_llama(dtype: torch.dtype, width: int, layers: int) -> torch.nn.Module:
    """A random ``width``-wide, ``layers``-layer Llama in ``dtype`` (64-wide heads, 3 query
    heads per K/V head, an MLP 8/3 as wide): the model the matmul probe's context term and the
    elementwise probe time."""
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 (slow import)

    config = LlamaConfig(
        hidden_size=width,
        intermediate_size=width * 8 // 3,
        num_attention_heads=max(1, width // 64),
        num_key_value_heads=max(1, width // 192),
        num_hidden_layers=layers,
        vocab_size=256,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu").to(dtype).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02, generator=generator)
        head = config.head_dim
        model.model.rotary_emb.inv_freq.copy_(
            1.0 / (10000 ** (torch.arange(0, head, 2, dtype=torch.float32) / head))
        )
    return model


def _no_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Attention's output shape ``(batch, tokens, heads, head dim)``, zero, kept per shape."""
    shape = (query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
    kept = module.__dict__.get("_probe_output")
    if kept is None or kept.shape != shape:
        kept = module.__dict__["_probe_output"] = query.new_zeros(shape)
    return kept, None


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
