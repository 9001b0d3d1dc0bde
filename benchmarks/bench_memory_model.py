"""Memory model against real transformers forwards on CPU, one tiny config per attention kind.

For each kind (MHA, GQA, MQA, sliding window, Gemma 2 layer types, MLA + MoE, Mamba, Mamba 2,
Bamba and Jamba hybrids, T5 and Bart cross-attention) and each attention implementation the
model accepts (eager, sdpa), the benchmark builds the model with random float32 weights, runs
a prefill of ``--tokens`` tokens with ``use_cache=True`` (``logits_to_keep=1`` where the model
takes it, as ``generate`` does) and then one decode step, and compares:

- weights: ``compute_module_sizes`` of the model built under ``init_empty_weights`` against the
  bytes of the real model's tensors;
- KV cache: ``kv_cache_per_layer(cache="dynamic")`` against the bytes of the returned cache;
- activation peak: ``activation_peak`` against the CPU allocator's peak during the forward
  (``torch.profiler`` memory events) minus the cache it returned;
- total: weights + KV + activation against weights + the measured peak;
- decode activation: ``decode_nbytes`` against the peak of the second generated token's
  forward minus what the cache grew by (the first step after a prefill also frees the prompt's
  K/V storage that sliding layers keep a view of, so it is not the steady state);
- second chunk (decoder-only models): a chunked prefill's second chunk of ``--tokens / 2``
  tokens after the first, ``forward_peak_terms(past=tokens / 2)`` against its peak above the
  memory held as it began, minus what the cache grew by, both chunks under one profiler
  (``tests/chunk_measure.py``; sdpa then gets a mask, and sliding layers keep the chunk's
  storage).

sdpa runs torch's CPU flash-attention kernel, whose per-thread workspace is counted with
``cpu_threads=torch.get_num_threads()``.

Targets (issue 21): KV exact; activation peak within 10%; total within 5%.

    python benchmarks/bench_memory_model.py [--tokens 512] [--batch 1]
"""

from __future__ import annotations

import argparse
import gc
import sys
import warnings
from pathlib import Path

import torch
import transformers as tf
from torch.profiler import ProfilerActivity, profile

from workbench.big_modeling.empty_init import init_empty_weights
from workbench.big_modeling.planning.activation_peak import activation_peak, forward_peak_terms
from workbench.big_modeling.planning.kv_cache import (
    kv_cache_per_layer,
    layout_of,
    measured_cache_nbytes,
)
from workbench.big_modeling.planning.sizes import compute_module_sizes

# The tests' tiny configs (tests/memory_model_configs.py), with windows below the prompt.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from chunk_measure import second_chunk_activation
from memory_model_configs import VOCAB, tiny_configs

_LABELS = {
    "gpt2-mha": "MHA (gpt2)",
    "llama-gqa": "GQA (llama)",
    "bigcode-mqa": "MQA (bigcode)",
    "mistral-sliding": "sliding (mistral)",
    "gemma2-layer-types": "layer types (gemma2)",
    "deepseek-v3-mla-moe": "MLA + MoE (deepseek v3)",
    "mamba": "state space (mamba)",
    "mamba2": "state space (mamba2)",
    "bamba-hybrid": "hybrid (bamba)",
    "jamba-hybrid-moe": "hybrid + MoE (jamba)",
    "t5-cross": "cross (t5)",
    "bart-cross": "cross (bart)",
}


def cases() -> dict[str, tuple[object, type]]:
    """The benchmark's kinds: the tests' configs with 64-token sliding windows."""
    configs = tiny_configs(sliding_window=64)
    return {label: configs[name] for name, label in _LABELS.items()}


def profiled_peak(model: torch.nn.Module, **inputs: object) -> tuple[int, object]:
    """Peak CPU bytes allocated during one forward (profiler memory events), and the output.

    Garbage is collected first: an earlier case's tensors, freed by a collection inside the
    window, would count as negative allocations.
    """
    gc.collect()
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = model(**inputs)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    current = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        current += event.nbytes()
        peak = max(peak, current)
    return peak, out


def _error(predicted: int, measured: int) -> str:
    return "exact" if predicted == measured else f"{100 * (predicted - measured) / measured:+.1f}%"


def run_case(
    name: str, config: object, model_class: type, impl: str, batch: int, tokens: int
) -> str | None:
    """One table row, or ``None`` when the model does not take this attention implementation."""
    config._attn_implementation = impl
    try:
        torch.manual_seed(0)
        model = model_class(config).eval()
    except ValueError:
        return None
    with init_empty_weights():
        empty = model_class(config)
    predicted_weights = compute_module_sizes(empty)[""]
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    measured_weights = sum(t.nbytes for t in tensors.values())
    encoder_decoder = getattr(config, "is_encoder_decoder", False)
    inputs: dict[str, object] = {
        "input_ids": torch.randint(0, VOCAB, (batch, tokens)),
        "use_cache": True,
    }
    decoder_tokens = tokens
    if encoder_decoder:
        inputs["decoder_input_ids"] = torch.zeros(batch, decoder_tokens, dtype=torch.long)
    else:
        inputs["logits_to_keep"] = 1
    try:
        peak, out = profiled_peak(model, **inputs)
    except TypeError:
        inputs.pop("logits_to_keep")
        peak, out = profiled_peak(model, **inputs)
    cache = out.past_key_values
    measured_kv = sum(measured_cache_nbytes(cache))
    predicted_kv = sum(
        layer.nbytes
        for layer in kv_cache_per_layer(
            config,
            batch=batch,
            context=decoder_tokens,
            encoder_context=tokens if encoder_decoder else None,
            model_dtype=torch.float32,
            cache="dynamic",
        )
    )
    peak_model = activation_peak(
        config,
        batch=batch,
        tokens=tokens,
        # the step measured below runs with the prompt and one generated token cached
        context=decoder_tokens + 2,
        dtype=torch.float32,
        attention="eager" if impl == "eager" else "sdpa",
        logits_to_keep=1 if "logits_to_keep" in inputs else 0,
        cpu_threads=torch.get_num_threads(),
    )
    measured_act = peak - measured_kv

    def decode_inputs() -> dict[str, object]:
        step = torch.randint(0, VOCAB, (batch, 1))
        if encoder_decoder:
            return {
                "cache": cache,
                "use_cache": True,
                "encoder_outputs": (out.encoder_last_hidden_state,),
                "decoder_input_ids": step,
            }
        return {"cache": cache, "use_cache": True, "input_ids": step}

    # One step first: a sliding layer's cache still holds the whole prompt's K/V storage
    # after the prefill (a view of its last window - 1 tokens), which the first step frees;
    # the second step is the steady state every later token repeats. The first runs under
    # the profiler too: it reports the release of a tensor only if it saw the allocation.
    profiled_peak(model, **decode_inputs())
    before = sum(measured_cache_nbytes(cache))
    decode_peak, _ = profiled_peak(model, **decode_inputs())
    grown = sum(measured_cache_nbytes(cache)) - before
    measured_decode = decode_peak - grown
    chunk = "-" if encoder_decoder else _second_chunk(model, config, impl, batch, tokens // 2)
    predicted_total = predicted_weights + predicted_kv + peak_model.prefill_nbytes
    measured_total = measured_weights + peak
    return (
        f"| {name} | {impl} | {predicted_weights} / {measured_weights} "
        f"({_error(predicted_weights, measured_weights)}) | {predicted_kv} / {measured_kv} "
        f"({_error(predicted_kv, measured_kv)}) | {peak_model.prefill_nbytes} / {measured_act} "
        f"({_error(peak_model.prefill_nbytes, measured_act)}) | "
        f"{_error(predicted_total, measured_total)} | {peak_model.decode_nbytes} / "
        f"{measured_decode} ({_error(peak_model.decode_nbytes, measured_decode)}) | {chunk} |"
    )


def _second_chunk(model: torch.nn.Module, config: object, impl: str, batch: int, chunk: int) -> str:
    """``"pred / meas (error)"`` of a prefill's second chunk (``chunk_measure``), or ``"-"``
    when the model's cache takes no chunk after a prefill."""
    try:
        measured = second_chunk_activation(model, batch, chunk)
    except (TypeError, ValueError, RuntimeError):
        return "-"
    predicted = forward_peak_terms(
        layout_of(config),
        batch=batch,
        tokens=chunk,
        past=chunk,
        nbytes=4,
        attention="eager" if impl == "eager" else "sdpa",
        logits_to_keep=1,
        cpu_threads=torch.get_num_threads(),
    )["peak"]
    return f"{predicted} / {measured} ({_error(predicted, measured)})"


def main() -> None:
    """Print the table (markdown) of predicted / measured bytes and errors."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    tf.logging.set_verbosity_error()
    print(
        f"prefill of {args.tokens} tokens, batch {args.batch}, float32, CPU, transformers {tf.__version__}"
    )
    print(
        "| kind | attention | weights pred / meas | KV pred / meas | activation pred / meas | total "
        "| decode activation pred / meas | second chunk pred / meas |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, (config, model_class) in cases().items():
        for impl in ("eager", "sdpa"):
            row = run_case(name, config, model_class, impl, args.batch, args.tokens)
            if row is not None:
                print(row, flush=True)


if __name__ == "__main__":
    main()
