"""KV cache bytes per decoder layer, by attention kind, for a batch and a context length.

The arithmetic per layer (``B`` batch, ``S`` context tokens, ``E`` encoder tokens, ``b`` bytes
per element of the KV dtype, ``s`` of the model dtype)::

    full (MHA/GQA/MQA)  B * S * kv_heads * (head_dim + v_head_dim) * b
    sliding             the same with S replaced by the tokens the cache keeps:
                          cache="static":  min(S, window)      (StaticCache allocates that)
                          cache="dynamic": min(S, window - 1)  (DynamicCache trims to that)
    MLA, latent         B * S * (kv_lora_rank + qk_rope_head_dim) * b
    MLA, expanded       B * S * heads * (qk_nope + qk_rope + v_head_dim) * b
    state-space         B * (conv_channels * conv_kernel + prod(recurrent)) * s   (no S)
    cross-attention     + B * E * kv_heads * (head_dim + v_head_dim) * b

Which MLA figure applies depends on the engine: transformers 5 (checked on 5.24), vLLM and
SGLang cache the compressed latent; transformers 4.x cached the expanded per-head K/V
(``engine="transformers-4"``). The workbench's own loads run transformers, hence the default.

Example:
    >>> from transformers import LlamaConfig
    >>> config = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
    ...                      num_key_value_heads=2)
    >>> [layer.nbytes for layer in kv_cache_per_layer(config, batch=1, context=8,
    ...                                                kv_dtype="fp16")]
    [1024, 1024]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.planning.attention_kinds import (
    AttentionLayout,
    LayerAttention,
    read_attention_layout,
)
from workbench.big_modeling.planning.dtype_sizes import as_dtype, element_nbytes

__all__ = [
    "ENGINES",
    "LayerKV",
    "default_context",
    "describe_dtype",
    "kv_cache_per_layer",
    "layout_of",
    "measured_cache_nbytes",
]

Engine = Literal["transformers", "transformers-4", "vllm", "sglang"]
ENGINES: dict[str, str] = {
    "transformers": "latent",
    "transformers-4": "expanded",
    "vllm": "latent",
    "sglang": "latent",
}
_DTYPE_WORDS = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.float8_e4m3fn: "fp8",
    torch.float8_e5m2: "fp8 e5m2",
    torch.int8: "int8",
}


@dataclass(frozen=True)
class LayerKV:
    """The cache one decoder layer keeps.

    Attributes:
        index: the layer's position in the decoder stack.
        attention: the layer's attention description.
        self_nbytes: bytes of self-attention K/V (or the MLA latent).
        cross_nbytes: bytes of cross-attention K/V over the encoder output.
        state_nbytes: bytes of a state-space / linear-attention layer's fixed-size state.
        words: the arithmetic in words, e.g. ``"GQA 2 of 4 heads: 1 x 8 tokens x 2 x (16 + 16)
            x 2 B"``.
    """

    index: int
    attention: LayerAttention
    self_nbytes: int
    cross_nbytes: int
    state_nbytes: int
    words: str

    @property
    def nbytes(self) -> int:
        """All bytes the layer's cache holds."""
        return self.self_nbytes + self.cross_nbytes + self.state_nbytes


def layout_of(config_or_layout: Any) -> AttentionLayout:
    """``config_or_layout`` itself when it is an ``AttentionLayout``, else its layout."""
    if isinstance(config_or_layout, AttentionLayout):
        return config_or_layout
    return read_attention_layout(config_or_layout)


def default_context(config_or_layout: Any, context_cap: int = 32768) -> int:
    """The context to plan for: ``max_position_embeddings`` capped by ``context_cap``.

    A model that states no maximum (T5's relative positions, Mamba) gets ``context_cap``; a
    model that supports less than the cap gets its own maximum, never a fixed figure beyond it.

    Raises:
        BadInputError: for a non-positive ``context_cap``.

    Example:
        >>> from transformers import GPT2Config
        >>> default_context(GPT2Config()), default_context(GPT2Config(), context_cap=512)
        (1024, 512)
    """
    if context_cap <= 0:
        raise BadInputError(f"context_cap must be positive, got {context_cap}")
    supported = layout_of(config_or_layout).max_position_embeddings
    return min(supported, context_cap) if supported else context_cap


def describe_dtype(dtype: torch.dtype) -> str:
    """``"fp16"``, ``"bf16"``, ``"fp8"``, ``"int8"``... the words the explanations use."""
    return _DTYPE_WORDS.get(dtype, str(dtype).removeprefix("torch."))


def _self_attention(
    layer: LayerAttention, batch: int, context: int, b: float, latent: bool, cache: str
) -> tuple[float, str]:
    if layer.kind == "none":
        return 0, ""
    if layer.kind == "mla" and layer.mla is not None:
        mla = layer.mla
        if latent:
            width = mla.kv_lora_rank + mla.qk_rope_head_dim
            return batch * context * width * b, (
                f"{batch} x {context} tokens x ({mla.kv_lora_rank} + {mla.qk_rope_head_dim}) x {b:g} B"
            )
        width = layer.heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim)
        return batch * context * width * b, (
            f"{batch} x {context} tokens x {layer.heads} x ({mla.qk_nope_head_dim} + "
            f"{mla.qk_rope_head_dim} + {mla.v_head_dim}) x {b:g} B"
        )
    tokens = context
    if layer.kind == "sliding" and layer.window is not None:
        kept = layer.window if cache == "static" else layer.window - 1
        tokens = min(context, kept)
    width = layer.kv_heads * (layer.head_dim + layer.v_head_dim)
    return batch * tokens * width * b, (
        f"{batch} x {tokens} tokens x {layer.kv_heads} x ({layer.head_dim} + {layer.v_head_dim})"
        f" x {b:g} B"
    )


def kv_cache_per_layer(
    config: Any,
    *,
    batch: int,
    context: int,
    kv_dtype: torch.dtype | str | None = None,
    model_dtype: torch.dtype | str = torch.float16,
    engine: Engine = "transformers",
    cache: Literal["static", "dynamic"] = "static",
    encoder_context: int | None = None,
) -> list[LayerKV]:
    """Bytes of cache each decoder layer keeps for ``batch`` sequences of ``context`` tokens.

    See the module docstring for the arithmetic of each kind.

    Args:
        config: a transformers config (or an ``AttentionLayout`` already read from one).
        batch: sequences.
        context: tokens per sequence the cache holds (prompt plus generated tokens).
        kv_dtype: dtype of the K/V tensors (``"fp16"``, ``"bf16"``, ``"fp8"``, ``"int8"``...);
            ``None`` means the model dtype.
        model_dtype: the dtype the model runs in; state-space states are kept in it.
        engine: whose cache layout to count (MLA differs, see the module docstring).
        cache: ``"static"`` (what ``StaticCache`` allocates; the bound a reserve needs) or
            ``"dynamic"`` (what ``DynamicCache`` holds after a forward).
        encoder_context: encoder tokens cross-attention keeps (encoder-decoder models);
            ``None`` means ``context``.

    Returns:
        One ``LayerKV`` per decoder layer, in order.

    Raises:
        BadInputError: for a non-positive batch or context, an unknown engine or cache, or a
            config the layout reader rejects.

    Example:
        >>> from transformers import MistralConfig
        >>> config = MistralConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
        ...                        num_key_value_heads=1, sliding_window=4)
        >>> kv_cache_per_layer(config, batch=1, context=100, kv_dtype="fp16")[0].nbytes
        256
    """
    if batch <= 0 or context <= 0:
        raise BadInputError(f"batch and context must be positive, got {batch} and {context}")
    if engine not in ENGINES:
        raise BadInputError(f"engine {engine!r} is not one of {', '.join(ENGINES)}")
    if cache not in ("static", "dynamic"):
        raise BadInputError(f"cache {cache!r} is not 'static' or 'dynamic'")
    layout = layout_of(config)
    state_dtype = as_dtype(model_dtype)
    b = element_nbytes(as_dtype(kv_dtype) if kv_dtype is not None else state_dtype)
    s = element_nbytes(state_dtype)
    latent = ENGINES[engine] == "latent"
    encoder_tokens = encoder_context if encoder_context is not None else context
    if layout.encoder_only:  # one forward over the whole input, nothing kept
        return [
            LayerKV(x.index, x, 0, 0, 0, f"{x.label}: encoder, no cache") for x in layout.layers
        ]
    result = []
    for layer in layout.layers:
        self_bytes, self_words = _self_attention(layer, batch, context, b, latent, cache)
        cross_bytes = 0.0
        words = [f"{layer.label}: {self_words}"] if self_words else [layer.label]
        if layer.cross_attention and layer.kind != "none":
            width = layer.kv_heads * (layer.head_dim + layer.v_head_dim)
            cross_bytes = batch * encoder_tokens * width * b
            words.append(f"cross {batch} x {encoder_tokens} encoder tokens x {width} x {b:g} B")
        state_bytes = 0.0
        if layer.state is not None:
            state_bytes = batch * layer.state.elements * s
            recurrent = " x ".join(str(d) for d in layer.state.recurrent)
            words.append(
                f"state {batch} x ({layer.state.conv_channels} x {layer.state.conv_kernel} + "
                f"{recurrent}) x {s:g} B"
            )
        result.append(
            LayerKV(
                index=layer.index,
                attention=layer,
                self_nbytes=math.ceil(self_bytes),
                cross_nbytes=math.ceil(cross_bytes),
                state_nbytes=math.ceil(state_bytes),
                words="; ".join(words),
            )
        )
    return result


def _layer_tensor_nbytes(layer: Any) -> int:
    total = 0
    for name in ("keys", "values"):
        tensor = getattr(layer, name, None)
        if isinstance(tensor, torch.Tensor):
            total += tensor.nbytes
    for name in ("conv_states", "recurrent_states"):
        states = getattr(layer, name, None)
        if isinstance(states, dict):
            total += sum(t.nbytes for t in states.values() if isinstance(t, torch.Tensor))
    return total


def measured_cache_nbytes(cache: Any) -> list[int]:
    """Bytes each layer of a real transformers cache holds, per decoder layer.

    Reads a transformers 5 ``Cache`` (``DynamicCache``, ``StaticCache``; duck-typed through
    ``cache.layers[i].keys / values / conv_states / recurrent_states``); an
    ``EncoderDecoderCache`` adds its cross-attention layers to the same indices. The figure to
    compare with ``kv_cache_per_layer(...)[i].nbytes``.

    Example:
        >>> from transformers import DynamicCache
        >>> cache = DynamicCache()
        >>> _ = cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), 0)
        >>> measured_cache_nbytes(cache)
        [192]
    """
    parts = [cache]
    if hasattr(cache, "self_attention_cache"):
        parts = [cache.self_attention_cache, cache.cross_attention_cache]
    totals: list[int] = []
    for part in parts:
        for index, layer in enumerate(part.layers):
            if index == len(totals):
                totals.append(0)
            totals[index] += _layer_tensor_nbytes(layer)
    return totals
