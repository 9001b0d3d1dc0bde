"""The worker's one-time set-up that a first run would otherwise pay inside its memory figure.

A worker's first inference run started three threads and kept C heap state that no later run
adds, none of it the model's (issue 21, measured on the 8M-parameter llama demo, 2-core EPYC):

- the tokenizer's Rust thread pool, started by its first ``encode`` (two threads);
- torch's intra-op thread pool, started by its first parallel kernel (one thread);
- ``scaled_dot_product_attention``'s first call in a process, which keeps 240-280 KiB of C heap
  whatever the dtype, and 77 KiB more for each further dtype;
- the first matmuls on the pool's threads, which touch their stacks and malloc arenas (about
  0.2 MiB for an 8M-parameter GPT-2 demo's float16 run).

Those threads' stacks and arenas, and that kernel state, made a first run measure up to 0.5
MiB above a later run of the same prompt: 6% of a demo's CPU total. ``warm_up_runtime``
does all of it once, with tiny inputs, before a load reads its CPU baseline, so it is counted
in the load's runtime overhead (shown apart) and each run measures what the model used.

Example:
    >>> warm_up_runtime(None, None)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.nn import functional

__all__ = ["warm_up_runtime"]

logger = logging.getLogger(__name__)

_PARALLEL_ELEMENTS = 2**18  # above torch's grain size (32768): the kernel runs on the pool
_WARM_TEXT = "warm"
_ATTENTION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what models compute in
_MATMUL_ROWS, _MATMUL_SIDE = 64, 512  # a matmul big enough to run on every pool thread
_done: set[object] = set()  # what this process has warmed: "threads", and dtypes


def warm_up_runtime(tokenizer: Any, dtype: torch.dtype | None) -> None:
    """Start the thread pools; run attention and a matmul once in ``dtype`` (and float32).

    Args:
        tokenizer: the loaded tokenizer, or ``None``; its first ``encode`` starts its pool.
        dtype: the model's compute dtype (``None``: float32 only).
    """
    if tokenizer is not None:
        try:
            tokenizer(_WARM_TEXT)
        except Exception:  # a tokenizer that cannot encode fails the run, with its own error
            logger.debug("tokenizer warm-up failed", exc_info=True)
    with torch.inference_mode():
        if "threads" not in _done:
            torch.ones(_PARALLEL_ELEMENTS).add_(1)
            _done.add("threads")
        for each in dict.fromkeys((torch.float32, dtype)):
            if each not in _ATTENTION_DTYPES or each in _done:
                continue
            query = torch.zeros(1, 1, 2, 8, dtype=each)
            functional.scaled_dot_product_attention(query, query, query, is_causal=True)
            rows = torch.zeros(_MATMUL_ROWS, _MATMUL_SIDE, dtype=each)
            weight = torch.zeros(_MATMUL_SIDE, _MATMUL_SIDE, dtype=each)
            functional.linear(rows, weight, weight[0])  # an addmm, on the pool's threads
            _done.add(each)
