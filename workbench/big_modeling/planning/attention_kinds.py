"""Per-layer attention descriptions read from a transformers config: what each layer caches.

``read_attention_layout(config)`` turns a config (duck-typed: any object with the attributes a
transformers ``PretrainedConfig`` has) into one ``LayerAttention`` per decoder layer:

- dense attention, ``MHA`` / ``GQA`` / ``MQA`` by ``num_key_value_heads`` (or ``multi_query``)
  against the heads, with ``head_dim`` where the config has it, else ``hidden / heads``;
- sliding-window layers (``sliding_window``; the per-layer pattern of ``layer_types``, or the
  older ``sliding_window_pattern`` of Gemma 3; ``attention_chunk_size`` of Llama 4);
- MLA (DeepSeek V2/V3: ``kv_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``,
  ``v_head_dim``);
- state-space / linear-attention layers with a fixed-size state (Mamba, Mamba 2, the Mamba
  layers of Jamba and Bamba, the gated delta-net layers of Qwen3-Next);
- cross-attention over the encoder output in encoder-decoder models (T5, Bart);
- MoE layers (experts change the weights, not the cache; noted, nothing else).

A layer type or attention key this module does not understand falls back to dense attention
and raises an ``AttentionKindWarning`` naming the keys, and the layout keeps the message in
``warnings``. An encoder-only model (BERT and its kin run as masked LMs or classifiers) keeps
no cache at all: ``AttentionLayout.encoder_only``, told from transformers' model mappings,
the one import of transformers here (made when a layout is read).

Example:
    >>> from transformers import LlamaConfig
    >>> layout = read_attention_layout(LlamaConfig(num_hidden_layers=2, hidden_size=64,
    ...     num_attention_heads=4, num_key_value_heads=2))
    >>> layout.layers[0].kind, layout.layers[0].grouping, layout.layers[0].head_dim
    ('full', 'GQA', 16)
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from typing import Any, Literal

from workbench.big_modeling.errors import BadInputError

__all__ = [
    "AttentionKindWarning",
    "AttentionLayout",
    "LayerAttention",
    "MlaShape",
    "StateShape",
    "read_attention_layout",
]

AttentionKind = Literal["full", "sliding", "mla", "none"]

_LAYERS = ("num_decoder_layers", "decoder_layers", "num_hidden_layers", "n_layer", "num_layers")
_HIDDEN = ("hidden_size", "n_embd", "d_model")
_HEADS = ("decoder_attention_heads", "num_attention_heads", "n_head", "num_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "multi_query_group_num")
_INTERMEDIATE = ("intermediate_size", "n_inner", "decoder_ffn_dim", "ffn_dim", "d_ff")
_EXPERTS = ("n_routed_experts", "num_local_experts", "num_experts")
_STATE_SPACE_MODELS = ("mamba", "mamba2", "falcon_mamba")

_FULL_TYPES = ("full_attention", "attention", "global", "global_attention")
_SLIDING_TYPES = ("sliding_attention", "local", "local_attention", "chunked_attention")
_STATE_TYPES = ("linear_attention", "mamba", "conv")
_NO_CACHE_TYPES = ("moe", "mlp", "dummy")

# Config keys that name an attention variant. One of these with a value this module did not use
# means the layout may be wrong, so the fallback warns and names it.
_VARIANT_KEY = re.compile(
    r"window|attn_type|attention_type|attention_layers|block_type|linear_attn|chunk|"
    r"lora_rank|kv_shar|shared_kv|ssm|mamba|state_size|kv_layer"
)
_UNDERSTOOD = {
    "sliding_window",
    "layer_types",
    "sliding_window_pattern",
    "_sliding_window_pattern",
    "use_sliding_window",
    "max_window_layers",
    "attention_chunk_size",
    "kv_lora_rank",
    "q_lora_rank",
    "state_size",
    "conv_kernel",
    "mamba_d_state",
    "mamba_d_conv",
    "mamba_expand",
    "mamba_n_heads",
    "mamba_d_head",
    "mamba_n_groups",
    "mamba_chunk_size",
    "chunk_size",
    "use_mamba_kernels",
    "mamba_dt_rank",
    "mamba_conv_bias",
    "mamba_proj_bias",
    "mamba_step",
    "mamba_d_ssm",
    "time_step_rank",
    "attn_layer_indices",
    "attn_layer_period",
    "attn_layer_offset",
    "layers_block_type",
    "linear_conv_kernel_dim",
    "chunk_size_feed_forward",
}


class AttentionKindWarning(UserWarning):
    """A config declares an attention variant the memory model does not know; dense was used."""


@dataclass(frozen=True)
class MlaShape:
    """Multi-head latent attention dimensions (DeepSeek V2/V3).

    Attributes:
        kv_lora_rank: width of the compressed K/V latent.
        qk_rope_head_dim: width of the rotary part of each key, shared across heads.
        qk_nope_head_dim: width of the non-rotary part of each key head.
        v_head_dim: width of each value head.
    """

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class StateShape:
    """The fixed-size state of a state-space or linear-attention layer, per sequence.

    Attributes:
        conv_channels: channels of the causal convolution state.
        conv_kernel: its kernel width (tokens kept).
        recurrent: shape of the recurrent state after the batch dimension.
        family: ``"mamba"``, ``"mamba2"`` or ``"gated_delta_net"``.
        chunk: tokens per chunk of a chunked scan (Mamba 2), else ``None``.
    """

    conv_channels: int
    conv_kernel: int
    recurrent: tuple[int, ...]
    family: str
    chunk: int | None = None

    @property
    def elements(self) -> int:
        """Elements of conv plus recurrent state for one sequence."""
        return self.conv_channels * self.conv_kernel + math.prod(self.recurrent)


@dataclass(frozen=True)
class LayerAttention:
    """What one decoder layer attends with, hence what its cache holds.

    Attributes:
        index: the layer's position in the decoder stack.
        kind: ``"full"``, ``"sliding"``, ``"mla"`` or ``"none"`` (no attention cache).
        heads: query heads.
        kv_heads: key/value heads (``heads`` for MHA, fewer for GQA, 1 for MQA).
        head_dim: width of each key head.
        v_head_dim: width of each value head.
        window: tokens a sliding layer attends to, else ``None``.
        mla: the latent dimensions for ``kind == "mla"``.
        state: the fixed-size state of a state-space / linear-attention layer.
        cross_attention: whether the layer also caches K/V over the encoder output.
        moe: whether the layer's MLP is a mixture of experts (weights only).
    """

    index: int
    kind: AttentionKind
    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    window: int | None = None
    mla: MlaShape | None = None
    state: StateShape | None = None
    cross_attention: bool = False
    moe: bool = False

    @property
    def grouping(self) -> str:
        """``"MHA"``, ``"GQA"`` or ``"MQA"`` by the ratio of key/value heads to heads."""
        if self.kv_heads == self.heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else "GQA"

    @property
    def label(self) -> str:
        """Short words for the kind: ``"GQA 8 of 32 heads"``, ``"sliding 4096, MQA"``..."""
        heads = f"{self.grouping} {self.kv_heads} of {self.heads} heads"
        parts: list[str] = []
        if self.kind == "full":
            parts.append(heads)
        elif self.kind == "sliding":
            parts.append(f"sliding window {self.window}, {heads}")
        elif self.kind == "mla" and self.mla is not None:
            parts.append(f"MLA latent {self.mla.kv_lora_rank} + rope {self.mla.qk_rope_head_dim}")
        if self.state is not None:
            parts.append(f"{self.state.family} state")
        if self.cross_attention:
            parts.append("cross-attention")
        if self.moe:
            parts.append("MoE")
        return ", ".join(parts) or "no cache"


@dataclass(frozen=True)
class AttentionLayout:
    """The decoder's layers as the memory model sees them, plus the sizes it needs.

    Attributes:
        model_type: the config's ``model_type`` (``""`` when it has none).
        layers: one ``LayerAttention`` per decoder layer.
        hidden_size: width of the residual stream.
        intermediate_size: width of the MLP (``4 * hidden`` when the config has none).
        vocab_size: vocabulary size (``0`` when the config has none).
        max_position_embeddings: longest context the model supports, ``None`` if unstated.
        gated_mlp: whether the MLP has gate and up projections (Llama family) or one (GPT-2).
        encoder_decoder: whether the model has an encoder whose output the decoder attends to.
        relative_position_bias: whether attention adds a materialised position bias (T5).
        rotary_dim: width of the rotary embedding's cos and sin per token (``0``: no rotary
            embedding); the MLA rope width, or ``head_dim`` times ``partial_rotary_factor``.
        mlp_activation: the MLP's activation function name (``hidden_act``...), ``""`` if unstated.
        warnings: messages about keys that were not understood (also raised as warnings).
        encoder_only: whether the model is an encoder run without a cache (``BertForMaskedLM``):
            its layers attend over the whole input in one forward and keep no K/V.
    """

    model_type: str
    layers: tuple[LayerAttention, ...]
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int | None
    gated_mlp: bool
    encoder_decoder: bool
    relative_position_bias: bool = False
    rotary_dim: int = 0
    mlp_activation: str = ""
    warnings: tuple[str, ...] = ()
    encoder_only: bool = False


def _int(config: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _text_config(config: Any) -> Any:
    if hasattr(config, "get_text_config"):
        try:
            return config.get_text_config(decoder=True)
        except TypeError:
            return config.get_text_config()
    return config


def _state_shape(config: Any, model_type: str, hidden: int) -> StateShape | None:
    """The state of one Mamba / Mamba 2 / gated delta-net layer, read from the config."""
    linear_dk = _int(config, ("linear_key_head_dim",))
    if linear_dk is not None:
        nk = _int(config, ("linear_num_key_heads",)) or 1
        nv = _int(config, ("linear_num_value_heads",)) or nk
        dv = _int(config, ("linear_value_head_dim",)) or linear_dk
        kernel = _int(config, ("linear_conv_kernel_dim",)) or 4
        return StateShape(
            2 * nk * linear_dk + nv * dv, kernel, (nv, linear_dk, dv), "gated_delta_net"
        )
    prefixed = _int(config, ("mamba_d_state",)) is not None
    d_state = _int(config, ("mamba_d_state", "state_size"))
    if d_state is None:
        return None
    kernel = _int(config, ("mamba_d_conv", "conv_kernel")) or 4
    expand = _int(config, ("mamba_expand", "expand")) or 2
    inner = _int(config, ("mamba_d_ssm",)) if prefixed else None
    if inner is None and not prefixed and model_type in _STATE_SPACE_MODELS:
        inner = _int(config, ("intermediate_size",))
    inner = inner or expand * hidden
    n_heads = _int(config, ("mamba_n_heads",) if prefixed else ("num_heads",))
    d_head = _int(config, ("mamba_d_head",) if prefixed else ("head_dim",))
    if model_type == "mamba2" or (prefixed and n_heads is not None and d_head is not None):
        groups = _int(config, ("mamba_n_groups",) if prefixed else ("n_groups",)) or 1
        heads = n_heads or inner // 64
        head = d_head or inner // heads
        chunk = _int(config, ("mamba_chunk_size", "chunk_size")) or 256
        return StateShape(
            inner + 2 * groups * d_state, kernel, (heads, head, d_state), "mamba2", chunk
        )
    return StateShape(inner, kernel, (inner, d_state), "mamba")


def _rotary_dim(config: Any, mla: MlaShape | None, head_dim: int) -> int:
    """Width of the rotary cos/sin per token: 0 without ``rope_parameters`` / ``rope_theta``."""
    rope = getattr(config, "rope_parameters", None)
    if not isinstance(rope, dict) and not getattr(config, "rope_theta", None):
        return 0
    if mla is not None:
        return mla.qk_rope_head_dim
    factor = (rope or {}).get("partial_rotary_factor") or getattr(
        config, "partial_rotary_factor", None
    )
    return int(head_dim * factor) if isinstance(factor, (int, float)) else head_dim


def _layer_types(config: Any, count: int, model_type: str) -> list[str]:
    declared = getattr(config, "layer_types", None)
    if isinstance(declared, (list, tuple)) and len(declared) == count:
        return [str(kind) for kind in declared]
    block_types = getattr(config, "layers_block_type", None)
    if isinstance(block_types, (list, tuple)) and len(block_types) == count:
        return [str(kind) for kind in block_types]
    if model_type in _STATE_SPACE_MODELS:
        return ["mamba"] * count
    window = getattr(config, "sliding_window", None)
    pattern = getattr(config, "sliding_window_pattern", None)
    if isinstance(window, int) and isinstance(pattern, int) and pattern > 0:
        return [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(count)
        ]
    if isinstance(window, int) and window > 0 and getattr(config, "use_sliding_window", True):
        return ["sliding_attention"] * count
    if _int(config, ("attention_chunk_size",)) is not None:
        return ["chunked_attention"] * count
    return ["full_attention"] * count


def _unused_variant_keys(config: Any) -> list[str]:
    names = config.to_dict() if hasattr(config, "to_dict") else vars(config)
    return sorted(
        name
        for name, value in names.items()
        if _VARIANT_KEY.search(name)
        and name not in _UNDERSTOOD
        and not name.startswith(("linear_", "mamba_"))
        and "multiplier" not in name
        and value not in (None, False, 0, "", [], {})
    )


_GENERATIVE_ARCHITECTURES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def _encoder_only(config: Any, model_type: str) -> bool:
    """True for an encoder run without a cache: a model type transformers builds as a masked
    LM, not declared a decoder, whose ``architectures`` name no generative head (BERT also has
    a causal ``BertLMHeadModel``, run with ``is_decoder=True``)."""
    if getattr(config, "is_encoder_decoder", False) or getattr(config, "is_decoder", False):
        return False
    from transformers.models.auto.modeling_auto import (  # noqa: PLC0415
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return False
    architectures = [str(a) for a in (getattr(config, "architectures", None) or ())]
    if any(a.endswith(_GENERATIVE_ARCHITECTURES) for a in architectures):
        return False
    return bool(architectures) or model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def read_attention_layout(config: Any, *, warn: bool = True) -> AttentionLayout:
    """Describe each decoder layer of ``config``: attention kind, heads, window, state.

    Multimodal configs are read through their text (decoder) config. For an encoder-decoder
    model the layers are the decoder's; each carries ``cross_attention=True`` (the encoder keeps
    no cache).

    Args:
        config: a transformers ``PretrainedConfig`` or any object with its attributes.
        warn: raise an ``AttentionKindWarning`` for keys that were not understood (they are
            listed in ``warnings`` either way).

    Returns:
        The ``AttentionLayout``.

    Raises:
        BadInputError: for a config without layer count or width, or without heads where a
            layer needs attention.

    Example:
        >>> from transformers import Gemma2Config
        >>> layout = read_attention_layout(Gemma2Config(num_hidden_layers=4, sliding_window=5))
        >>> [layer.kind for layer in layout.layers]
        ['sliding', 'full', 'sliding', 'full']
    """
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    text = config if encoder_decoder else _text_config(config)
    model_type = str(getattr(text, "model_type", "") or getattr(config, "model_type", "") or "")
    count = _int(text, _LAYERS)
    hidden = _int(text, _HIDDEN)
    if count is None or hidden is None:
        raise BadInputError(
            f"{type(config).__name__} has no layer count or hidden size (looked for "
            f"{', '.join(_LAYERS + _HIDDEN)}); pass a transformers config of a decoder model"
        )
    types = _layer_types(text, count, model_type)
    heads = _int(text, _HEADS) or 0
    kv_heads = _int(text, _KV_HEADS) or heads
    if getattr(text, "multi_query", False):
        kv_heads = 1
    head_dim = _int(text, ("head_dim", "d_kv")) or (hidden // heads if heads else 0)
    v_head_dim = _int(text, ("v_head_dim",)) or head_dim
    window = _int(text, ("sliding_window",)) or _int(text, ("attention_chunk_size",))
    mla = None
    if _int(text, ("kv_lora_rank",)) is not None:
        rope = _int(text, ("qk_rope_head_dim",)) or 0
        nope = _int(text, ("qk_nope_head_dim",)) or 0
        mla = MlaShape(text.kv_lora_rank, rope, nope, v_head_dim)
        head_dim = rope + nope
    state = _state_shape(text, model_type, hidden)
    experts = _int(text, _EXPERTS)
    moe_from = _int(text, ("first_k_dense_replace",)) or 0
    moe_period = _int(text, ("expert_layer_period", "decoder_sparse_step")) or 1
    moe_offset = _int(text, ("expert_layer_offset",)) or 0

    problems: list[str] = []
    layers = []
    for index, declared in enumerate(types):
        kind: AttentionKind
        layer_state = None
        layer_window = None
        if declared in _FULL_TYPES or declared == "hybrid":
            kind = "mla" if mla is not None else "full"
        elif declared in _SLIDING_TYPES or declared == "hybrid_sliding":
            kind, layer_window = "sliding", window
        elif declared in _STATE_TYPES or declared in _NO_CACHE_TYPES:
            kind = "none"
        else:
            kind = "full"
            problems.append(f"layer_types[{index}]={declared!r}")
        if declared in _STATE_TYPES or declared.startswith("hybrid"):
            layer_state = state
            if state is None:
                problems.append(f"layer_types[{index}]={declared!r} without a state size")
                if kind == "none" and heads:
                    kind = "full"
        if kind in ("full", "sliding", "mla") and not heads:
            raise BadInputError(
                f"{type(config).__name__} layer {index} attends but the config has no heads "
                f"(looked for {', '.join(_HEADS)})"
            )
        if kind == "sliding" and layer_window is None:
            kind = "full"
            problems.append(f"layer_types[{index}]={declared!r} without sliding_window")
        is_moe = (
            experts is not None and index >= moe_from and (index - moe_offset) % moe_period == 0
        )
        layers.append(
            LayerAttention(
                index=index,
                kind=kind,
                heads=heads,
                kv_heads=kv_heads,
                head_dim=head_dim,
                v_head_dim=v_head_dim,
                window=layer_window,
                mla=mla if kind == "mla" else None,
                state=layer_state,
                cross_attention=encoder_decoder,
                moe=is_moe,
            )
        )
    problems.extend(f"{name}={getattr(text, name, None)!r}" for name in _unused_variant_keys(text))
    messages: tuple[str, ...] = ()
    if problems:
        messages = (
            f"{type(config).__name__}: the memory model does not understand "
            f"{', '.join(problems)}; those layers are counted as dense attention",
        )
        if warn:
            warnings.warn(messages[0], AttentionKindWarning, stacklevel=2)
    intermediate = _int(text, _INTERMEDIATE) or 4 * hidden
    act = str(
        getattr(text, "hidden_act", "")
        or getattr(text, "hidden_activation", "")
        or getattr(text, "activation_function", "")
        or getattr(text, "dense_act_fn", "")
    )
    gated = model_type.startswith(
        ("llama", "mistral", "qwen", "gemma", "deepseek", "bamba", "jamba")
    )
    gated = gated or bool(getattr(text, "is_gated_act", False)) or "glu" in act
    return AttentionLayout(
        model_type=model_type,
        layers=tuple(layers),
        hidden_size=hidden,
        intermediate_size=intermediate,
        vocab_size=_int(text, ("vocab_size",)) or _int(config, ("vocab_size",)) or 0,
        max_position_embeddings=_int(text, ("max_position_embeddings", "n_positions", "n_ctx")),
        gated_mlp=gated,
        encoder_decoder=encoder_decoder,
        relative_position_bias=_int(text, ("relative_attention_num_buckets",)) is not None,
        rotary_dim=_rotary_dim(text, mla, head_dim),
        mlp_activation=act,
        warnings=messages,
        encoder_only=not encoder_decoder and _encoder_only(text, model_type),
    )
