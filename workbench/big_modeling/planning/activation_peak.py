"""Activation peak of one forward, prefill and decode, beyond the weights and the KV cache.

The arithmetic (``B`` batch, ``T`` tokens computed in this forward, ``S`` tokens attended,
``P`` cached before it, so ``S = P + T``, or for a sliding layer ``min(P + T, window - 1 + T)``;
``H`` hidden, ``I`` MLP width, ``h`` heads, ``d`` head
width, ``V`` vocabulary, ``K`` positions whose logits are computed, ``s`` bytes per element of
the compute dtype)::

    residual   = 4 * B * T * H * s            residual stream, its norm, attention output, sum
    mask       = B * T * S * s * patterns     the additive causal mask, one per pattern (full,
                                              sliding) the layers use (eager only)
    attention  = B * h * T * S * (s + 4)      eager: the scores and their float32 softmax
               + B * h * T * d * s            queries
               + 2 * B * h * S * d * s        K/V repeated to all heads (eager GQA/MQA only;
                                              sdpa groups heads itself, GPTBigCode
                                              broadcasts its one head); for MLA, the K/V
                                              expanded from the latent, in every implementation
               (sdpa / flash: no scores materialised, except where key and value
               widths differ (MLA): torch's math kernel materialises them as eager does)
    mlp        = 3 * B * T * I * s            gate, up and their product (gated MLP)
               = 2 * B * T * I * s            projection and activation (GPT-2 style)
    logits     = B * K * V * s                K = 1 in generate (``logits_to_keep=1``), else T
    peak       = residual + mask + max(attention, mlp, logits)

Encoder-decoder eager attention (Bart, T5) keeps the pre-softmax scores as well
(``B * h * T * S * (2 * s + 4)``), and T5 keeps its position bias twice (with and without the
mask, ``2 * B * h * T * S * s``) through the stack.

With sdpa, a layer whose window the context exceeds needs an explicit mask:
``B * T * S * (1 + s)`` (the bool mask and its additive copy) instead of ``is_causal``.

Decode is the same with ``T = 1``, plus, for a ``DynamicCache``, the largest layer's K (or V) once
more (``torch.cat`` builds the grown tensor while the old one lives). State-space layers replace ``attention`` by their scan
workspace: Mamba's reference (torch) scan holds about four ``B * T * inner * state`` tensors
(discretised A and B, B times the input, and one in flight); Mamba 2's chunked scan about four
``B * heads * T * chunk`` (decay, scores, masked scores, an einsum copy; ``T`` padded to whole
chunks); other scans are counted as ``3 * B * T * conv_channels * s``, a rough figure. MoE
layers count the dense MLP width ``I``.
Measured against transformers 5 on CPU by ``benchmarks/bench_memory_model.py``.

Example:
    >>> from transformers import LlamaConfig
    >>> config = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
    ...                      num_key_value_heads=2, intermediate_size=128, vocab_size=100)
    >>> peak = activation_peak(config, batch=1, tokens=8, dtype="fp16")
    >>> peak.prefill_nbytes > peak.decode_nbytes
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.planning.attention_kinds import (
    AttentionLayout,
    LayerAttention,
    StateShape,
)
from workbench.big_modeling.planning.dtype_sizes import as_dtype, element_nbytes
from workbench.big_modeling.planning.kv_cache import kv_cache_per_layer, layout_of

__all__ = ["ActivationPeak", "activation_peak", "forward_peak_terms"]

AttentionImplementation = Literal["eager", "sdpa", "flash_attention_2"]


@dataclass(frozen=True)
class ActivationPeak:
    """Transient bytes of a prefill and of one decode step (KV cache and weights excluded).

    Attributes:
        prefill_nbytes: peak of the forward over the prompt.
        decode_nbytes: peak of one generated token's forward with the full context cached.
        prefill_terms: each term of the prefill peak by name (``"attention"``, ``"mlp"``...).
        words: the largest prefill term in words, e.g. ``"eager attention scores"``.
    """

    prefill_nbytes: int
    decode_nbytes: int
    prefill_terms: dict[str, int]
    words: str


def forward_peak_terms(
    layout: AttentionLayout,
    *,
    batch: int,
    tokens: int,
    past: int,
    nbytes: float,
    attention: str,
    logits_to_keep: int,
) -> dict[str, int]:
    """The terms of one forward's peak, by name (see the module docstring).

    Returns:
        ``{"residual", "mask", "attention", "mlp", "logits", "peak"}`` in bytes.
    """
    b, t, s = batch, tokens, past + tokens
    eager = attention == "eager"
    # encoder-decoder eager attention (Bart, T5) keeps the pre-softmax scores alive too
    scores_factor = (2 * nbytes + 4) if layout.encoder_decoder else (nbytes + 4)
    attention_bytes = 0.0
    heads = 0
    # GPTBigCode's MQA broadcasts its one K/V head instead of repeating it
    repeats = layout.model_type != "gpt_bigcode"
    masks: dict[str, float] = {}
    for layer in layout.layers:
        if layer.kind != "none":
            heads, dim = layer.heads, max(layer.head_dim, layer.v_head_dim)
            seen = _attended(layer, t, s)
            layer_bytes = b * heads * t * dim * nbytes
            if layer.kind == "mla":
                layer_bytes += b * heads * seen * (layer.head_dim + layer.v_head_dim) * nbytes
            elif eager and repeats and layer.kv_heads < heads:
                layer_bytes += 2 * b * heads * seen * dim * nbytes
            # torch's sdpa falls back to its math kernel (scores materialised, counted as
            # eager) when key and value widths differ, as in MLA
            if eager or layer.head_dim != layer.v_head_dim:
                layer_bytes += b * heads * t * seen * scores_factor
                masks[layer.kind] = b * t * seen * nbytes
            elif layer.window is not None and s > layer.window:
                # sdpa cannot use is_causal past a window: a bool mask and its additive copy
                masks[layer.kind] = b * t * seen * (1 + nbytes)
            attention_bytes = max(attention_bytes, layer_bytes)
        if layer.state is not None:
            attention_bytes = max(attention_bytes, _scan_bytes(layer.state, b, t, nbytes))
    width = layout.intermediate_size
    mlp = (3 if layout.gated_mlp else 2) * b * t * width * nbytes
    kept = t if logits_to_keep <= 0 else min(t, logits_to_keep)
    logits = b * kept * layout.vocab_size * nbytes
    residual = 4 * b * t * layout.hidden_size * nbytes
    if layout.relative_position_bias:
        # T5: the position bias, and the bias with the mask added, live through the stack
        residual += 2 * b * heads * t * s * nbytes
    # one mask per pattern: a model with full and sliding layers builds both
    mask = sum(masks.values())
    terms = {
        "residual": int(residual),
        "mask": int(mask),
        "attention": int(attention_bytes),
        "mlp": int(mlp),
        "logits": int(logits),
    }
    terms["peak"] = (
        terms["residual"] + terms["mask"] + max(terms["attention"], terms["mlp"], terms["logits"])
    )
    return terms


def _attended(layer: LayerAttention, tokens: int, seen: int) -> int:
    """Keys one query attends to: all ``seen``, or for a sliding layer its window."""
    if layer.window is None:
        return seen
    return min(seen, layer.window - 1 + tokens)


def _scan_bytes(state: StateShape, batch: int, tokens: int, nbytes: float) -> float:
    """Workspace of a state-space layer's prefill scan (the torch reference implementations)."""
    if state.family == "mamba":
        # discretised A, discretised B, B times the input, and one in flight
        return 4 * batch * tokens * state.conv_channels * state.recurrent[-1] * nbytes
    if state.family == "mamba2" and state.chunk:
        # the chunked scan's decay L, scores G and masked M per head, and an einsum copy
        chunk = min(state.chunk, tokens) if tokens < state.chunk else state.chunk
        padded = -(-tokens // chunk) * chunk
        return 4 * batch * state.recurrent[0] * padded * chunk * nbytes
    return 3 * batch * tokens * state.conv_channels * nbytes


_WORDS = {
    "attention": "attention",
    "mlp": "MLP intermediate",
    "logits": "logits over the vocabulary",
}


def activation_peak(
    config: Any,
    *,
    batch: int,
    tokens: int,
    context: int | None = None,
    dtype: torch.dtype | str = torch.float16,
    attention: AttentionImplementation = "sdpa",
    logits_to_keep: int = 1,
    cache: Literal["static", "dynamic"] = "dynamic",
) -> ActivationPeak:
    """Peak transient bytes of a prefill of ``tokens`` and of a decode step at ``context``.

    Args:
        config: a transformers config (or an ``AttentionLayout``).
        batch: sequences per forward.
        tokens: prompt tokens of the prefill.
        context: tokens cached when decoding (``None``: ``tokens``).
        dtype: the compute dtype.
        attention: the model's attention implementation; ``"eager"`` materialises the scores.
        logits_to_keep: positions whose logits are computed (transformers' ``generate`` uses
            1; ``0`` means every position, as in a plain forward).
        cache: ``"dynamic"`` (``DynamicCache``: each decode step concatenates, so one layer's
            K or V exists twice for a moment; counted in ``decode_nbytes``) or ``"static"``
            (updated in place).

    Returns:
        The ``ActivationPeak``.

    Raises:
        BadInputError: for a non-positive batch or token count.

    Example:
        >>> from transformers import GPT2Config
        >>> config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100)
        >>> eager = activation_peak(config, batch=1, tokens=512, attention="eager")
        >>> sdpa = activation_peak(config, batch=1, tokens=512, attention="sdpa")
        >>> eager.words, eager.prefill_nbytes > sdpa.prefill_nbytes
        ('eager attention scores', True)
    """
    if batch <= 0 or tokens <= 0:
        raise BadInputError(f"batch and tokens must be positive, got {batch} and {tokens}")
    layout = layout_of(config)
    nbytes = element_nbytes(as_dtype(dtype))
    prefill = forward_peak_terms(
        layout,
        batch=batch,
        tokens=tokens,
        past=0,
        nbytes=nbytes,
        attention=attention,
        logits_to_keep=logits_to_keep,
    )
    decode_context = context or tokens
    copy = 0
    if cache == "dynamic":
        layers = kv_cache_per_layer(
            layout, batch=batch, context=decode_context, model_dtype=dtype, cache="dynamic"
        )
        copy = max((layer.self_nbytes for layer in layers), default=0) // 2
    decode = forward_peak_terms(
        layout,
        batch=batch,
        tokens=1,
        past=max(decode_context - 1, 0),
        nbytes=nbytes,
        attention=attention,
        logits_to_keep=1,
    )
    largest = max(("attention", "mlp", "logits"), key=lambda name: prefill[name])
    words = _WORDS[largest]
    if largest == "attention" and attention == "eager":
        words = "eager attention scores"
    return ActivationPeak(
        prefill_nbytes=prefill["peak"],
        decode_nbytes=decode["peak"] + copy,
        prefill_terms=prefill,
        words=words,
    )
