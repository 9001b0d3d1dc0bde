"""Per-layer terms of the activation peak: attention working sets, CPU kernel workspace, scans.

The arithmetic is described in ``activation_peak``'s module docstring; these helpers compute
one attention layer's working set and mask, torch's CPU flash-attention workspace, and the
workspace of a state-space layer's scan.
"""

from __future__ import annotations

import functools
import math
from importlib import metadata

from workbench.big_modeling.planning.attention_kinds import (
    AttentionLayout,
    LayerAttention,
    StateShape,
)

__all__ = ["attended", "attention_bytes", "cpu_flash_workspace", "scan_bytes"]


def attention_bytes(
    layout: AttentionLayout,
    layer: LayerAttention,
    b: int,
    t: int,
    seen: int,
    total: int,
    nbytes: float,
    attention: str,
    repeats: bool,
    scores_factor: float,
    cpu_threads: int | None,
) -> tuple[float, float]:
    """One attention layer's working set and the mask it needs, in bytes.

    Args:
        layout: the model's layout (model type, position bias).
        layer: the attention layer.
        b: batch; t: tokens computed; seen: keys attended; total: tokens cached after it.
        nbytes: bytes per element of the compute dtype.
        attention: ``"eager"``, ``"sdpa"`` or ``"flash_attention_2"``.
        repeats: whether fewer K/V heads are repeated to every head (not GPTBigCode).
        scores_factor: bytes per eager score (its softmax, and pre-softmax copy).
        cpu_threads: threads of torch's CPU flash kernel, ``None`` off CPU.

    Returns:
        ``(working set, mask)``.
    """
    h, dq, dv = layer.heads, layer.head_dim, layer.v_head_dim
    eager = attention == "eager"
    scores = b * h * t * seen
    queries = b * h * t * dq * nbytes
    working = queries
    mask = 0.0
    if layer.kind == "mla" and layer.mla is not None:
        # kv_b_proj's per-head non-rotary K and V, and the keys with the rope part appended
        working += b * h * seen * (layer.mla.qk_nope_head_dim + dv) * nbytes
        working += b * h * seen * dq * nbytes
    # sdpa needs an explicit mask past a sliding window, or for a chunk of queries after a
    # cache (is_causal aligns queries with the first keys; it cannot express either)
    explicit_mask = (layer.window is not None and total > layer.window) or 1 < t < total
    repeated = eager or (explicit_mask and t > 1)
    if layer.kind != "mla" and repeats and layer.kv_heads < h and repeated:
        # K and V repeated to every head (transformers' repeat_kv; sdpa repeats them when it
        # gets a mask, except for one query, whose heads it packs instead)
        working += 2 * b * h * seen * max(dq, dv) * nbytes
    if eager:
        working += scores * scores_factor
        mask = b * t * seen * nbytes
        if b > 1 and (not repeats or layer.kind == "mla"):
            # torch.matmul folds batch and heads into one bmm batch: MQA's K broadcast over
            # the heads, and MLA's V (a slice of kv_b_proj's output) cannot be viewed so past
            # one sequence, and are copied
            working += b * h * seen * (dq if not repeats else dv) * nbytes
    elif dq != dv:
        # torch's math kernel (key and value widths differ, as in MLA): the scaled query,
        # then either the scaled keys beside the scores, or the scores, their softmax and
        # its -inf test (bool), with a float causal mask built from is_causal
        scaled_q = queries
        matmul = b * h * seen * dq * nbytes + scores * nbytes
        softmax = scores * (2 * nbytes + 1) + (t * seen * nbytes if t > 1 else 0)
        working += scaled_q + max(matmul, softmax)
    else:
        kernel = b * h * t * dv * nbytes  # the kernel's output
        if cpu_threads:
            kernel += cpu_flash_workspace(cpu_threads, t, seen, dv, nbytes)
        if layout.relative_position_bias and t > 1:
            # T5: before the kernel, sdpa folds the bias and a causal bool mask into one
            # float mask (``torch.where``, and its copy); the kernel then reads one of them
            building = 2 * h * t * seen * nbytes + t * seen
            kernel = max(building, h * t * seen * nbytes + kernel)
        working += kernel
        if explicit_mask:
            # the model's bool mask (shared by the batch without a padding mask), and the
            # additive float mask sdpa makes of it for every sequence while it runs
            mask = t * seen
            working += b * t * seen * nbytes
    return working, mask


def cpu_flash_workspace(threads: int, t: int, seen: int, dv: int, nbytes: float) -> float:
    """Per-thread buffers of torch's CPU flash attention (``FlashAttentionKernel.cpp``).

    Each thread holds a float32 ``q_split x kv_split`` score block, its row max and sum, and
    a ``q_split x dv`` output block; reduced dtypes add a ``q_split x kv_split`` copy.
    """
    q_split = 256 if t >= 768 else 64 if t >= 192 else 32
    q_split, kv_split = min(q_split, t), min(512, seen)
    buffer = threads * (q_split * kv_split + 2 * q_split + q_split * dv) * 4
    reduced = threads * q_split * kv_split * nbytes if nbytes < 4 else 0
    return buffer + reduced


def attended(layer: LayerAttention, tokens: int, seen: int) -> int:
    """Keys one query attends to: all ``seen``, or for a sliding layer its window."""
    if layer.window is None:
        return seen
    return min(seen, layer.window - 1 + tokens)


@functools.cache
def clones_recurrent_state() -> bool:
    """Whether the installed transformers' Mamba / Mamba 2 decode step works on a copy of the
    recurrent state (5.25 and later: ``mamba_scan_forward`` clones it, so a cache can record the
    history), which is one more state-sized tensor at the step's peak."""
    try:
        major, minor = (int(part) for part in metadata.version("transformers").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return True
    return (major, minor) >= (5, 25)


def scan_bytes(state: StateShape, batch: int, tokens: int, nbytes: float) -> float:
    """Workspace of a state-space layer's scan (the torch reference implementations)."""
    if tokens == 1 and state.family in ("mamba", "mamba2"):
        # one recurrent step: exp(dt A), dt B, dt B x, the decayed state and the new state,
        # each the size of the state (transformers 5.25+: and the copy the step updates);
        # Mamba also forms A = -exp(A_log) (no batch; 5.25+: exp's result lives while it is
        # negated); the input projection (x and gate)
        states = 6 if clones_recurrent_state() else 5
        step = states * batch * math.prod(state.recurrent) * nbytes
        if state.family == "mamba":
            step += (2 if clones_recurrent_state() else 1) * math.prod(state.recurrent) * nbytes
        return step + 2 * batch * state.conv_channels * nbytes
    if state.family == "mamba":
        # discretised A, discretised B, B times the input, and one in flight
        return 4 * batch * tokens * state.conv_channels * state.recurrent[-1] * nbytes
    if state.family == "mamba2" and state.chunk:
        return _chunked_scan_bytes(state, batch, tokens, nbytes)
    return 3 * batch * tokens * state.conv_channels * nbytes


def _chunked_scan_bytes(state: StateShape, batch: int, tokens: int, nbytes: float) -> float:
    """Mamba 2's chunked scan (``mamba2_chunk_scan``'s torch path) at its peak, in bytes.

    The scan's locals all live until it returns, so its peak is its last step: float32
    whatever the model's dtype, over ``T`` padded to whole chunks.
    """
    heads, head, d_state = state.recurrent
    inner = heads * head
    chunks = -(-tokens // state.chunk)
    padded = chunks * state.chunk
    # the decay L, scores G and masked scores M, per head and chunk
    scan = 3 * heads * padded * state.chunk
    # D times x, x times dt in chunks, Y_diag, C times the states, Y_off, Y_diag + Y_off and
    # its contiguous copy
    scan += 7 * padded * inner
    # B and C repeated to the heads (in chunks), and B times its decay
    scan += 3 * padded * heads * d_state
    # A times dt (in chunks), its cumsum, the decay to the chunk's end and from its start
    scan += 4 * padded * heads
    # the zero initial state, the states at every chunk boundary, the decay between chunks
    scan += (chunks + 2) * inner * d_state + heads * (chunks + 1) ** 2
    # dt after its bias, softplus and clamp (the model's dtype)
    dt = tokens * heads * nbytes
    # the input projection (x, gate, B, C, dt) and the convolution's output
    projection = (inner + 2 * state.conv_channels + heads) * nbytes
    return batch * (scan * 4 + dt + tokens * projection)
