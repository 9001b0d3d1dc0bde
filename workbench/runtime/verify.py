"""Verify a dispatched model against the same weights run without dispatch, on the CPU.

The reference is built by ``transformers`` from the same folder (``from_pretrained`` on CPU, in
the dispatched model's dtype), so it shares no code with our engine. Both models see the same
input ids; the logits are compared element by element. On CPU with the same dtype the math is
identical, so ``exact`` is expected; on GPUs small differences are normal and ``atol``/``rtol``
set the bar. With ``Verify.greedy_tokens`` both models also continue the prompt greedily and
the tokens are compared one by one: the check a reader can see on a real model's text.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.progress import CancelToken
from workbench.runtime.inference import execution_device, generate_tokens
from workbench.runtime.model_inputs import (
    ModelInputs,
    check_positions,
    model_dtype,
    prepare_inputs,
)
from workbench.runtime.protocol import Event, Phase, Sampling, Verify, VerifyResult
from workbench.runtime.sampling import TokenPicker
from workbench.runtime.verify_compare import compare_outputs, forward_kwargs
from workbench.runtime.verify_layers import run_verify_layers
from workbench.runtime.verify_quantized import is_quantized_load, quantized_verify_result

logger = logging.getLogger(__name__)


def build_reference(loaded: Any) -> torch.nn.Module:
    """Load the same checkpoint into an undispatched CPU model with ``transformers``.

    Raises:
        BadInputError: when the source is not a folder ``transformers`` can load.
    """
    folder = getattr(loaded.opened, "folder", None)
    if folder is None:
        source = Path(loaded.opened.source)
        folder = source if source.is_dir() else source.parent
    cls = type(loaded.model)
    from_pretrained = getattr(cls, "from_pretrained", None)
    if from_pretrained is None:
        raise BadInputError(f"{cls.__name__} has no from_pretrained; cannot build a reference")
    from transformers.utils import logging as hf_logging  # noqa: PLC0415 (transformers is heavy)

    hf_logging.disable_progress_bar()  # the worker reports phases; no tqdm on stderr
    reference = from_pretrained(str(folder), dtype=model_dtype(loaded.model), device_map=None)
    return reference.to("cpu").eval()


def _logits(output: Any) -> torch.Tensor:
    logits = getattr(output, "logits", None)
    if logits is None:
        logits = getattr(output, "last_hidden_state", None)
    if logits is None and isinstance(output, (tuple, list)):
        logits = output[0]
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"cannot find the output tensor in {type(output).__name__}")
    return logits


VERIFY_MODES = ("auto", "full", "layers")
FULL_COPY_RAM_FRACTION = 0.5  # a full reference may use at most half the available RAM


def reference_nbytes(loaded: Any) -> int:
    """Bytes of an undispatched copy in the dispatched model's dtype."""
    itemsize = torch.empty((), dtype=model_dtype(loaded.model)).element_size()
    checkpoint = loaded.opened.checkpoint
    total = 0
    for info in getattr(checkpoint, "tensors", {}).values():
        numel = 1
        for dim in info.shape:
            numel *= dim
        total += numel * (itemsize if info.dtype.is_floating_point else info.dtype.itemsize)
    return total


def choose_mode(loaded: Any, mode: str) -> str:
    """Resolve ``"auto"``: ``"full"`` when a copy fits in half the available RAM.

    Raises:
        BadInputError: for an unknown mode.
    """
    if mode not in VERIFY_MODES:
        raise BadInputError(
            f"verify mode {mode!r} is unknown; use one of {', '.join(VERIFY_MODES)}"
        )
    if mode != "auto":
        return mode
    available = psutil.virtual_memory().available
    return "full" if reference_nbytes(loaded) <= FULL_COPY_RAM_FRACTION * available else "layers"


def compare_greedy(
    loaded: Any,
    reference: torch.nn.Module,
    inputs: ModelInputs,
    steps: int,
    token: CancelToken,
    result: VerifyResult,
) -> VerifyResult:
    """``result`` with ``steps`` greedy tokens of the dispatched model and of ``reference``
    compared token by token (each model continues its own text, so the first difference
    counts and the rest follow from it)."""
    ids = inputs.main
    with torch.inference_mode():
        dispatched = list(
            generate_tokens(
                loaded.model,
                ids.to(execution_device(loaded.device_map)),
                steps,
                TokenPicker(Sampling()),
                token=token,
            )
        )
        expected = list(
            generate_tokens(reference, ids, steps, TokenPicker(Sampling()), token=token)
        )
    matched = next(
        (i for i, (a, b) in enumerate(zip(dispatched, expected, strict=True)) if a != b), steps
    )
    tokenizer = loaded.tokenizer
    texts = ("", "")
    if tokenizer is not None:
        texts = tuple(tokenizer.decode(t, skip_special_tokens=True) for t in (dispatched, expected))
    return dataclasses.replace(
        result,
        greedy_compared=steps,
        greedy_matched=matched,
        greedy_text=texts[0],
        greedy_reference_text=texts[1],
    )


def run_verify(
    loaded: Any, request: Verify, token: CancelToken, emit: Callable[[Event], None]
) -> VerifyResult:
    """Run ``request``: the dispatched model and the CPU reference on the same input ids.

    A quantized load is compared with the full-precision model over the fixed prompt set
    instead (top-1 agreement and logit gap; ``verify_quantized``), always with a full copy.
    """
    if is_quantized_load(loaded):
        emit(Phase(request.request_id, "verify: quantized against full precision"))
        reference = build_reference(loaded)
        try:
            return quantized_verify_result(loaded, reference, execution_device(loaded.device_map))
        finally:
            del reference
    mode = choose_mode(loaded, request.mode)
    if mode == "layers":
        return run_verify_layers(loaded, request, token, emit)
    rid = request.request_id
    inputs = prepare_inputs(loaded, request.prompt, request.synthetic_tokens)
    generates = request.greedy_tokens > 0 and inputs.text and loaded.summary.is_causal_lm
    check_positions(loaded, inputs.tokens, request.greedy_tokens if generates else 0)
    emit(Phase(rid, "verify: dispatched forward"))
    start_s = time.perf_counter()
    with torch.inference_mode():
        moved = inputs.to(execution_device(loaded.device_map))
        actual = _logits(loaded.model(**forward_kwargs(loaded.model, moved))).cpu()
    token.raise_if_cancelled()
    emit(Phase(rid, "verify: reference forward"))
    reference = build_reference(loaded)
    token.raise_if_cancelled()
    try:
        with torch.inference_mode():
            expected = _logits(reference(**forward_kwargs(reference, inputs)))
        result = compare_outputs(actual, expected, atol=request.atol, rtol=request.rtol)
        if request.greedy_tokens > 0 and inputs.text and loaded.summary.is_causal_lm:
            emit(Phase(rid, "verify: greedy continuation"))
            result = compare_greedy(loaded, reference, inputs, request.greedy_tokens, token, result)
    finally:
        del reference
    logger.info(
        "verify %s in %.2f s: max abs %.3g, max rel %.3g",
        "passed" if result.passed else "FAILED",
        time.perf_counter() - start_s,
        result.max_abs_diff,
        result.max_rel_diff,
    )
    return result
