"""A prefill's second chunk measured on CPU, as the memory model predicts it: shared by
``tests/big_modeling/test_memory_model.py`` and ``benchmarks/bench_memory_model.py``.

Both chunks run under one profiler: the second chunk's ``torch.cat`` frees the cache the first
one made, and a profiler started after the first chunk sees only the new tensors (the frees are
of blocks it never saw allocated), which over-measured the chunk by the whole cache it replaced
(GPT-2 sdpa: -14.4%, Llama sdpa -11%). Measured: the peak during the second chunk above the
memory held as it began, less what the cache grew by, plus the storage the first chunk's
sliding layers kept beyond their cache's views (the memory model charges that storage to the
chunk that made it, as activations, not to the cache).
"""

from __future__ import annotations

import gc

import torch
from memory_model_configs import VOCAB
from torch.profiler import ProfilerActivity, profile, record_function

from workbench.big_modeling.planning.kv_cache import measured_cache_nbytes


def storage_beyond_views(cache: object) -> int:
    """Bytes a cache's K/V tensors keep alive beyond their own (a sliding layer's view of the
    last ``window - 1`` tokens keeps the whole concatenation it was cut from)."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor):
                total += tensor.untyped_storage().nbytes() - tensor.nbytes
    return total


def second_chunk_activation(model: torch.nn.Module, batch: int, chunk: int) -> int:
    """The activation bytes of a ``chunk``-token forward after a ``chunk``-token prefill.

    Raises:
        TypeError, ValueError, RuntimeError: the model takes no chunk after a prefill.
    """
    gc.collect()
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        first = model(
            input_ids=torch.randint(0, VOCAB, (batch, chunk)), use_cache=True, logits_to_keep=1
        )
        cache = first.past_key_values
        before = sum(measured_cache_nbytes(cache))
        overhang = storage_beyond_views(cache)
        with record_function("second chunk"):
            model(
                input_ids=torch.randint(0, VOCAB, (batch, chunk)),
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
    events = prof.profiler.kineto_results.events()
    (span,) = [e for e in events if e.name() == "second chunk"]
    memory = sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns())
    held = sum(e.nbytes() for e in memory if e.start_ns() < span.start_ns())
    current = peak = held
    for event in memory:
        if span.start_ns() <= event.start_ns() <= span.end_ns():
            current += event.nbytes()
            peak = max(peak, current)
    return peak - held + overhang - (sum(measured_cache_nbytes(cache)) - before)
