"""How much memory one device keeps free to run the whole model: KV cache plus activation peak.

``estimate_activation_reserve`` is the one-device figure of the memory model
(``device_reserve.reserve_per_device`` with every decoder layer on one device): the caches of
all layers by attention kind (sliding windows, MLA, state-space layers, cross-attention; see
``kv_cache``) plus the activation peak of one prefill (see ``activation_peak``). A plan with
layers on several devices should use ``reserve_per_device``, which charges each device only
for the layers it runs.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.planning.device_reserve import reserve_per_device
from workbench.big_modeling.planning.kv_cache import layout_of

__all__ = ["estimate_activation_reserve"]


def estimate_activation_reserve(
    config: Any,
    batch_size: int,
    seq_len: int,
    dtype: torch.dtype | str = torch.float16,
) -> int:
    """Bytes to keep free on the one device that runs a forward pass of ``seq_len`` tokens.

    The arithmetic (``B`` batch, ``T`` = ``seq_len``, ``b`` bytes per element of ``dtype``;
    the per-kind cache formulas are ``kv_cache``'s, the peak terms ``activation_peak``'s)::

        kv_cache   = sum over layers of the layer's cache at T tokens
                     (full attention: B * T * kv_heads * (head_dim + v_head_dim) * b)
        activation = residual (4 * B * T * hidden * b) + mask
                     + max(attention, MLP (3 or 2) * B * T * intermediate * b,
                           logits of the last position B * vocab * b)
        reserve    = kv_cache + activation

    for a prefill of ``T`` tokens with SDPA attention (transformers' default), the cache in
    ``dtype``. A multimodal config is read through its text config.

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
        >>> # kv: 2 layers * 1 * 8 tokens * 2 kv heads * (16 + 16) * 2 B = 2048 B
        >>> # activation: residual 4*8*64*2 = 4096 + MLP 3*8*128*2 = 6144 -> 10240 B
        >>> estimate_activation_reserve(config, batch_size=1, seq_len=8)
        12288
    """
    if batch_size <= 0 or seq_len <= 0:
        raise BadInputError(
            f"batch_size and seq_len must be positive, got batch_size={batch_size}, seq_len={seq_len}"
        )
    layout = layout_of(config)
    (reserve,) = reserve_per_device(
        layout,
        ["cpu"] * len(layout.layers),
        batch=batch_size,
        context=seq_len,
        model_dtype=dtype,
    ).values()
    return int(reserve.nbytes)
