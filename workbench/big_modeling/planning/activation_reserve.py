"""How much memory to keep free for activations and the KV cache, from a transformers config.

A device map that merely holds the weights still runs out of memory at the first long prompt.
``estimate_activation_reserve`` gives the bytes to pass as the planner's ``reserve`` for the
device that runs the model, so a map that "fits" also runs.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.planning.dtype_sizes import as_dtype, dtype_byte_size

__all__ = ["estimate_activation_reserve"]

# Attribute spellings across transformers architectures (Llama / GPT-2 / BERT / Falcon ...).
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
_HIDDEN = ("hidden_size", "n_embd", "d_model")
_HEADS = ("num_attention_heads", "n_head", "num_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "multi_query_group_num")
_INTERMEDIATE = ("intermediate_size", "n_inner", "ffn_dim", "d_ff")


def _first(config: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def estimate_activation_reserve(
    config: Any,
    batch_size: int,
    seq_len: int,
    dtype: torch.dtype | str = torch.float16,
) -> int:
    """Bytes to keep free on the execution device for a forward pass of ``seq_len`` tokens.

    The arithmetic (every factor read from the config; ``b`` = bytes per element of
    ``dtype``)::

        kv_cache   = 2 (K and V) * layers * batch * seq_len * kv_heads * head_dim * b
        largest    = max(
            batch * seq_len * 2 * intermediate * b,    # gate and up projections of the MLP
            batch * heads * seq_len * seq_len * b,     # eager attention scores (one layer)
            batch * seq_len * vocab * 4,               # logits, upcast to float32
        )
        reserve    = kv_cache + largest

    ``kv_heads`` is ``num_key_value_heads`` when the model uses grouped-query attention, else
    the number of heads; ``head_dim`` is ``config.head_dim`` or ``hidden / heads``;
    ``intermediate`` defaults to ``4 * hidden``. It is an upper bound for a prefill with eager
    attention; flash/SDPA attention needs less. Multimodal configs use their text config.

    Args:
        config: a transformers ``PretrainedConfig`` (or any object with those attributes).
        batch_size: sequences per forward.
        seq_len: tokens per sequence (prompt plus generated tokens for the KV cache).
        dtype: the compute dtype of activations and cache.

    Returns:
        Bytes, as an int, to pass as ``reserve={device: nbytes}``.

    Raises:
        BadInputError: for a non-positive batch or length, or a config without layer count,
            width or heads.

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
        ...                      num_key_value_heads=2, intermediate_size=128, vocab_size=100)
        >>> # kv 2*2*1*8*2*16*2 = 2048 B; largest: max(1*8*2*128*2, 1*4*8*8*2, 1*8*100*4) = 4096 B
        >>> estimate_activation_reserve(config, batch_size=1, seq_len=8)
        6144
    """
    if batch_size <= 0 or seq_len <= 0:
        raise BadInputError(
            f"batch_size and seq_len must be positive, got batch_size={batch_size}, seq_len={seq_len}"
        )
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = _first(text_config, _LAYERS)
    hidden = _first(text_config, _HIDDEN)
    heads = _first(text_config, _HEADS)
    missing = [
        label
        for label, value in (("layer count", layers), ("hidden size", hidden), ("heads", heads))
        if value is None
    ]
    if missing:
        raise BadInputError(
            f"{type(config).__name__} has no {', '.join(missing)} "
            f"(looked for {', '.join(_LAYERS + _HIDDEN + _HEADS)}); pass a transformers "
            "config of a decoder or encoder model"
        )
    kv_heads = _first(text_config, _KV_HEADS) or heads
    head_dim = _first(text_config, ("head_dim",)) or hidden // heads
    intermediate = _first(text_config, _INTERMEDIATE) or 4 * hidden
    vocab = _first(text_config, ("vocab_size",)) or 0
    nbytes = dtype_byte_size(as_dtype(dtype))

    tokens = batch_size * seq_len
    kv_cache = 2 * layers * tokens * kv_heads * head_dim * nbytes
    largest = max(
        tokens * 2 * intermediate * nbytes,
        batch_size * heads * seq_len * seq_len * nbytes,
        tokens * vocab * 4,
    )
    return int(kv_cache + largest)
