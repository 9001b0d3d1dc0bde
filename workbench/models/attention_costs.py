"""The time a layer's attention adds to a decode step and to a prefill, by context length.

The speed model's weight reads and matmul FLOPs do not grow with the context; attention does.
A decode step's attention reads the layer's whole KV cache, a prefill's compares every prompt
token with every earlier one. For a layer ``l`` of the ``AttentionLayout`` (its kind, ``H``
query and ``H_kv`` key/value heads of width ``d_k``, values of width ``d_v``) at batch ``B``,
with ``C`` tokens cached (``min(C, window)`` for a sliding layer) and a prompt of ``P``:

    measured (this CPU, the shape's ``attention_probe`` times ``t``):
        decode  = B x t.decode(C)
        prefill = B x t.prefill(P)           (x 2 for an encoder: every pair, not the causal half)
    otherwise (a GPU; a CPU without the probe):
        decode  = max(2 B H C (d_k + d_v) / F,  3 x B C H_kv (d_k + d_v) b / M)
        prefill = 2 B H (d_k + d_v) x P (P + 1) / 2 / F_prefill   (P^2 for an encoder)

``F`` is the execution device's FLOP/s at ``mfu`` (``F_prefill``: the CPU matmul probe's prefill
rate where it has one), ``M`` its bandwidth at ``mbu``, ``b`` the cache dtype's bytes. The 3 in
the decode read is what ``transformers``' ``DynamicCache`` and SDPA move per step: the cache's
``torch.cat`` reads and writes it once, the attention reads it. A sliding layer's prefill is
counted as a full one (SDPA computes every pair under a mask); an MLA layer is counted as
transformers runs it (``H_kv = H`` heads of ``qk_nope + qk_rope`` keys and ``v_head_dim``
values); a state-space layer (kind ``"none"``) adds nothing (its scan is linear in the prompt
and its state fixed). Cross-attention over an encoder's output is not counted.

Example:
    >>> from transformers import LlamaConfig
    >>> from workbench.big_modeling.planning.attention_kinds import read_attention_layout
    >>> layout = read_attention_layout(LlamaConfig(num_hidden_layers=1, hidden_size=64,
    ...     num_attention_heads=4, num_key_value_heads=2))
    >>> shapes = attention_shapes(layout, "float16")
    >>> [shape.key for shape in shapes]
    ['float16 4/2 heads x 16/16']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from workbench.big_modeling.dtypes import to_dtype
from workbench.big_modeling.planning.attention_kinds import AttentionLayout, LayerAttention
from workbench.big_modeling.planning.device_reserve import layer_module_names
from workbench.models.attention_probe import AttentionShape, AttentionTimes

__all__ = [
    "CACHE_TRAFFIC",
    "AttentionSeconds",
    "attention_by_module",
    "attention_seconds",
    "attention_shape",
    "attention_shapes",
]

CACHE_TRAFFIC = 3
"""Times a decode step moves a layer's KV cache: ``DynamicCache``'s ``cat`` reads and writes
it, the attention reads it."""


@dataclass(frozen=True)
class AttentionSeconds:
    """One layer's attention time.

    Attributes:
        decode_s: seconds of one decode step's attention.
        prefill_s: seconds of the prompt's attention.
        measured: whether they come from this CPU's probe (else FLOPs and bytes).
    """

    decode_s: float = 0.0
    prefill_s: float = 0.0
    measured: bool = False


def attention_shape(layer: LayerAttention, dtype: str) -> AttentionShape | None:
    """The shape ``sdpa_attention_forward`` runs for ``layer`` in ``dtype`` (``None``: a layer
    without attention)."""
    if layer.kind == "none":
        return None
    if layer.kind == "mla" and layer.mla is not None:
        mla = layer.mla
        width = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        return AttentionShape(layer.heads, layer.heads, width, mla.v_head_dim, dtype)
    return AttentionShape(layer.heads, layer.kv_heads, layer.head_dim, layer.v_head_dim, dtype)


def attention_shapes(layout: AttentionLayout, dtype: str) -> list[AttentionShape]:
    """The distinct attention shapes of ``layout``'s layers in ``dtype``: what this CPU's
    ``attention_probe`` measures for the model."""
    shapes = (attention_shape(layer, dtype) for layer in layout.layers)
    return list(dict.fromkeys(shape for shape in shapes if shape is not None))


def attention_by_module(
    module_names: Iterable[str], layout: AttentionLayout
) -> dict[str, LayerAttention]:
    """Each decoder layer's module name (``model.layers.3``) -> its ``LayerAttention``."""
    names = layer_module_names(module_names, len(layout.layers))
    return {name: layout.layers[index] for index, name in names.items()}


def attention_seconds(
    layer: LayerAttention | None,
    *,
    dtype: str,
    batch: int,
    context: int,
    prompt: int,
    flops_per_s: float,
    prefill_flops_per_s: float,
    memory_bytes_per_s: float,
    encoder_only: bool = False,
    times: Mapping[str, AttentionTimes] | None = None,
) -> AttentionSeconds:
    """``layer``'s attention seconds for a decode step over ``context`` cached tokens and a
    prefill of ``prompt`` tokens (module docs).

    Args:
        layer: the layer's attention (``None``: a module that is no decoder layer: none).
        dtype: the dtype name its cache and queries are in.
        batch: sequences.
        context: tokens in the cache during a decode step.
        prompt: prompt tokens of the prefill.
        flops_per_s: the execution device's FLOP/s (at its utilisation).
        prefill_flops_per_s: its FLOP/s for a prefill's matmuls.
        memory_bytes_per_s: its memory bandwidth (at its utilisation).
        encoder_only: every token attends to every other and nothing is decoded.
        times: this CPU's measured times by ``AttentionShape.key`` (``attention_probe``).
    """
    shape = attention_shape(layer, dtype) if layer is not None else None
    if layer is None or shape is None:
        return AttentionSeconds()
    cached = min(context, layer.window) if layer.kind == "sliding" and layer.window else context
    measured = (times or {}).get(shape.key)
    if measured is not None:
        prefill = batch * measured.prefill_seconds(prompt) * (2 if encoder_only else 1)
        decode = 0.0 if encoder_only else batch * measured.decode_seconds(cached)
        return AttentionSeconds(decode, prefill, measured=True)
    width = shape.head_dim + shape.v_head_dim
    pairs = prompt * prompt if encoder_only else prompt * (prompt + 1) / 2
    prefill = 2 * batch * shape.heads * width * pairs / prefill_flops_per_s
    if encoder_only:
        return AttentionSeconds(0.0, prefill)
    cache_bytes = batch * cached * shape.kv_heads * width * to_dtype(dtype).itemsize
    decode = max(
        2 * batch * shape.heads * cached * width / flops_per_s,
        CACHE_TRAFFIC * cache_bytes / memory_bytes_per_s,
    )
    return AttentionSeconds(decode, prefill)
