"""Activation peak of one forward, prefill and decode, beyond the weights and the KV cache.

The arithmetic (``B`` batch, ``T`` tokens computed in this forward, ``S`` tokens attended,
``P`` cached before it, so ``S = P + T``, or for a sliding layer ``min(P + T, window - 1 + T)``;
``H`` hidden, ``I`` MLP width, ``h`` heads, ``d`` / ``dv`` key / value head width, ``r`` rotary
width, ``V`` vocabulary, ``K`` positions whose logits are computed, ``s`` bytes per element of
the compute dtype). Every term is a tensor transformers 5 / torch allocate, measured on CPU by
``benchmarks/bench_memory_model.py``::

    residual   = 3 * B * T * H * s            token embeddings, the layer's input, its norm
               + B * T * H * s                encoder-decoder prefill: the encoder's output
               + T * H * s                    GPT-2 / GPTBigCode: position embeddings
               + 2 * B * T * r * s            the rotary cos and sin
               + 2 * h * T * S * s            T5: the position bias and its copy (no batch)
               + B * kv * (min(P, window - 1) + T - min(S, window - 1)) * (d + dv) * s
                                              per sliding layer, T > 1: the cache keeps a view
                                              of the last window - 1 tokens of the concatenated
                                              K/V, whose storage stays (a prefill: T - window + 1)
    mask       = B * T * S * s                eager: the additive mask, one per pattern
               = T * S                        sdpa past a window, or a chunk (1 < T < S) after
                                              a cache: the bool mask (is_causal cannot say it)
    attention  = B * h * T * d * s            queries
               + 2 * B * h * S * d * s        K/V repeated to all heads (GQA eager; sdpa
                                              with a mask and T > 1, a chunked prefill's chunks
                                              after the first too; not GPTBigCode)
               + B * h * T * S * (s + 4)      eager: scores and their float32 softmax
                                              (encoder-decoder: (2 * s + 4), the pre-softmax
                                              scores live too)
               + B * h * S * d * s            eager, B > 1: matmul's copy of MQA's broadcast K
                                              (of MLA's V slice)
               + B * h * T * dv * s           sdpa: the output
               + workspace                    sdpa on CPU: per thread a float32 q_split x
                                              kv_split score block and a q_split x dv output
               + B * T * S * s                sdpa with that mask: the mask made additive
               + max(2 * h * T * S * s + T * S, h * T * S * s + output + workspace)
                                              T5 sdpa: the bias folded with a causal mask
             MLA adds kv_b_proj's K/V (B * h * S * (nope + dv) * s) and the keys with their
             rope part (B * h * S * d * s); with sdpa (d != dv) torch's math kernel adds the
             scaled query and max(scaled keys + scores, scores + softmax + its bool -inf
             test + a float causal mask T * S * s)
    mlp        = (3 | 4 | 2) * B * T * I * s  gated (gate, up, product) | Python GELU
                                              (input, x / 2, x ** 3, 0.044715 x ** 3) | fused
               + B * T * H * s                the attention sum the MLP adds to (GPT-2: and its
                                              kept attention output, and eager probabilities)
    logits     = B * K * V * s                K = 1 in generate (``logits_to_keep=1``), else T
    copy       = a DynamicCache update (decode): the grown K of the largest layer while the
                 old one lives (a sliding layer: K and V over the window together)
    peak       = residual + mask + max(attention, mlp, logits, copy)

Decode is the same with ``T = 1``. State-space layers replace ``attention`` by their scan
workspace: Mamba's reference scan about four ``B * T * inner * state`` tensors; Mamba 2's chunked
scan, whose locals all live to its last step (float32, ``T'`` padded to ``c`` whole chunks), the
decay, scores and masked scores ``3 * B * heads * T' * chunk * 4``, seven ``B * T' * inner * 4``
(D times x, x times dt in chunks, the diagonal output, C times the states, the off-diagonal
output, their sum and its contiguous copy), three ``B * T' * heads * state * 4`` (B and C
repeated to the heads, B times its decay), four ``B * T' * heads * 4`` (A dt, its cumsum, the
decays to a chunk's end and from its start), ``(c + 2)`` states (the zero initial one and one per
chunk boundary) and ``dt``, plus the input projection and the convolution's output; one decode
step five state-sized tensors (``exp(dt A)``, ``dt B``, ``dt B x``, the decayed and the new
state; Mamba also ``A``), and with transformers 5.25 or later the copy of the state the step
updates (Mamba: and ``exp(A_log)`` beside ``A``); other scans ``3 * B * T * conv_channels * s``, a rough figure. In
Bamba and Falcon-H1 the layer loop keeps an eager attention layer's probabilities through the
next layer. MoE layers count the dense MLP width ``I``. The encoder's output is held through
decode like the cache (not in ``decode_nbytes``).

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
from workbench.big_modeling.planning.activation_terms import (
    attended,
    attention_bytes,
    scan_bytes,
)
from workbench.big_modeling.planning.attention_kinds import AttentionLayout
from workbench.big_modeling.planning.dtype_sizes import as_dtype, element_nbytes
from workbench.big_modeling.planning.kv_cache import LayerKV, kv_cache_per_layer, layout_of

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


# Models whose forward keeps the token and position embeddings and each block's attention
# output alive as locals (``inputs_embeds``, ``position_embeds``, ``attn_output``).
_KEEPS_EMBEDDINGS = ("gpt2", "gpt_bigcode")
# Models whose layer loop unpacks ``hidden_states, attn_weights = layer(...)``: the eager
# probabilities of one attention layer live through the next layer.
_LOOP_KEEPS_WEIGHTS = ("bamba", "falcon_h1")
# Activations written as Python arithmetic: ``x / 2``, ``x ** 3`` and ``0.044715 * x ** 3``
# exist beside their input (``NewGELUActivation``); fused activations make one tensor.
_PYTHON_GELU = ("gelu_new",)


def forward_peak_terms(
    layout: AttentionLayout,
    *,
    batch: int,
    tokens: int,
    past: int,
    nbytes: float,
    attention: str,
    logits_to_keep: int,
    cache_copy: int = 0,
    cpu_threads: int | None = None,
) -> dict[str, int]:
    """The terms of one forward's peak, by name (see the module docstring).

    Args:
        layout: the model's attention layout.
        batch: sequences per forward.
        tokens: tokens computed in this forward (``T``).
        past: tokens cached before it (``P``).
        nbytes: bytes per element of the compute dtype.
        attention: ``"eager"``, ``"sdpa"`` or ``"flash_attention_2"``.
        logits_to_keep: positions whose logits are computed (``0``: all).
        cache_copy: bytes a ``DynamicCache`` update holds twice for a moment (decode).
        cpu_threads: threads of torch's CPU flash-attention kernel, whose per-thread
            workspace sdpa then counts; ``None`` (GPU kernels tile on chip): no workspace.

    Returns:
        ``{"residual", "mask", "attention", "mlp", "logits", "copy", "peak"}`` in bytes.
    """
    b, t, s = batch, tokens, past + tokens
    eager = attention == "eager"
    prefill = past == 0
    # encoder-decoder eager attention (Bart, T5) keeps the pre-softmax scores alive too
    scores_factor = (2 * nbytes + 4) if layout.encoder_decoder else (nbytes + 4)
    working = 0.0
    heads = 0
    kept_weights = 0.0
    # GPTBigCode's MQA broadcasts its one K/V head instead of repeating it
    repeats = layout.model_type != "gpt_bigcode"
    masks: dict[str, float] = {}
    sliding_storage = 0.0
    for layer in layout.layers:
        if layer.kind != "none":
            heads = layer.heads
            seen = attended(layer, t, s)
            layer_bytes, mask = attention_bytes(
                layout, layer, b, t, seen, s, nbytes, attention, repeats, scores_factor, cpu_threads
            )
            if mask:
                masks[layer.kind] = mask
            if layer.kind == "sliding" and t > 1 and layer.window is not None:
                # the cache keeps a view of the last window - 1 tokens of the concatenated
                # cached and new K/V, whose storage stays: a prefill chunk adds all its tokens
                kept = min(past, layer.window - 1)
                dropped = kept + t - min(past + t, layer.window - 1)
                sliding_storage += (
                    b * layer.kv_heads * dropped * (layer.head_dim + layer.v_head_dim) * nbytes
                )
            working = max(working, layer_bytes)
            if eager and layout.model_type in _LOOP_KEEPS_WEIGHTS:
                kept_weights = b * heads * t * seen * nbytes
        if layer.state is not None:
            scan = scan_bytes(layer.state, b, t, nbytes) + kept_weights
            working = max(working, scan)
    width = layout.intermediate_size
    if layout.gated_mlp:
        mlp = 3 * b * t * width * nbytes
    elif layout.mlp_activation in _PYTHON_GELU:
        mlp = 4 * b * t * width * nbytes
    else:
        mlp = 2 * b * t * width * nbytes
    keeps_embeddings = layout.model_type in _KEEPS_EMBEDDINGS
    # beside the MLP: the attention sum it adds to (and GPT-2's kept attention output, and
    # with eager its probabilities)
    mlp += (2 if keeps_embeddings else 1) * b * t * layout.hidden_size * nbytes
    if keeps_embeddings and eager:
        mlp += b * heads * t * s * nbytes
    kept = t if logits_to_keep <= 0 else min(t, logits_to_keep)
    logits = b * kept * layout.vocab_size * nbytes
    # the token embeddings, the layer's input and its norm
    streams = 3
    if layout.encoder_decoder and prefill:
        streams += 1  # the encoder's output, which the decoder's cross-attention reads
    residual = streams * b * t * layout.hidden_size * nbytes + sliding_storage
    if keeps_embeddings:
        residual += t * layout.hidden_size * nbytes  # position embeddings, one per position
    # the rotary embedding's cos and sin, shared by every layer
    residual += 2 * b * t * layout.rotary_dim * nbytes
    if layout.relative_position_bias:
        # T5: the looked-up bias (1, h, T, S) and its permuted copy, passed down the stack
        residual += 2 * heads * t * s * nbytes
    # one mask per pattern: a model with full and sliding layers builds both
    mask_bytes = sum(masks.values())
    terms = {
        "residual": int(residual),
        "mask": int(mask_bytes),
        "attention": int(working),
        "mlp": int(mlp),
        "logits": int(logits),
        "copy": int(cache_copy),
    }
    terms["peak"] = (
        terms["residual"]
        + terms["mask"]
        + max(terms["attention"], terms["mlp"], terms["logits"], terms["copy"])
    )
    return terms


def _update_copy(layer: LayerKV, context: int) -> int:
    """Bytes a ``DynamicCache`` update of one layer holds beside the old tensors.

    ``torch.cat`` builds the grown K while the old one lives, then V; a sliding layer
    concatenates K and V before it drops the old ones, over ``window`` tokens.
    """
    window = layer.attention.window
    if layer.attention.kind == "sliding" and window is not None:
        cached = min(context, window - 1)
        return layer.self_nbytes * min(context, window) // max(cached, 1)
    return layer.self_nbytes // 2


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
    cpu_threads: int | None = None,
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
            K or V exists twice for a moment, a sliding layer's K and V together; counted in
            ``decode_nbytes``) or ``"static"`` (updated in place).
        cpu_threads: for a forward on CPU, the threads of torch's flash-attention kernel
            (``torch.get_num_threads()``), whose per-thread workspace sdpa then counts;
            ``None`` for accelerators, whose kernels tile in on-chip memory.

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
        cpu_threads=cpu_threads,
    )
    decode_context = context or tokens
    copy = 0
    if cache == "dynamic":
        layers = kv_cache_per_layer(
            layout, batch=batch, context=decode_context, model_dtype=dtype, cache="dynamic"
        )
        copy = max((_update_copy(layer, decode_context) for layer in layers), default=0)
    decode = forward_peak_terms(
        layout,
        batch=batch,
        tokens=1,
        past=max(decode_context - 1, 0),
        nbytes=nbytes,
        attention=attention,
        logits_to_keep=1,
        cache_copy=copy,
        cpu_threads=cpu_threads,
    )
    largest = max(("attention", "mlp", "logits"), key=lambda name: prefill[name])
    words = _WORDS[largest]
    if largest == "attention" and attention == "eager":
        words = "eager attention scores"
    return ActivationPeak(
        prefill_nbytes=prefill["peak"],
        decode_nbytes=decode["peak"],
        prefill_terms=prefill,
        words=words,
    )
