"""Predict decode speed and time to first token of a device map on a hardware profile.

A cost model in the spirit of FlexGen (Sheng et al., 2023): every forward pass moves the
weights that do not live on their execution device, and every layer then runs on that device
for the time its compute or its memory traffic takes, whichever is longer.

The model is cut into *layers*: the no-split blocks (e.g. ``model.layers.17``) and, outside
them, each module that holds tensors directly (``model.embed_tokens``, ``lm_head``). For each
layer with ``W`` planning bytes and ``N`` parameters, stored on tier ``s`` and executed on
device ``e`` (its own GPU; the main GPU for cpu/disk tiers when the map has a GPU; else the CPU):

    transfer_s  = W / BW_h2d                      if s == "cpu" and e is a GPU
                = W / BW_disk (+ W / BW_page)     if s == "disk" (the second term when e is a GPU)
                = 0                               otherwise
    read        = sum over its tensors t of W_t / (M_e * mbu * eff(e, p_t))
    attention   = the layer's attention (``attention_costs``): one decode step over the C
                  tokens its cache holds, or the prefill over the prompt; measured for the
                  model's head shape on this CPU (``attention_probe``), else its FLOPs and
                  cache bytes
    work        = max(2 N B / (F_e * mfu), read) + attention       decode: one token, batch B
                = max(2 N B P / (F_e * mfu), read) + attention     prefill: a prompt of P tokens
                  (on the CPU with a matmul curve: read + 2 N B P / rate(P), below)
    elementwise = T B e sqrt(N)            on the CPU, a block's norms, rotary, activation and
                                            residuals over T tokens (1 to decode, P to prefill)
    dispatch    = modules in the layer * module_call_s   the host's Python and dispatcher
    compute     = work + elementwise + dispatch   on the CPU (the same cores do both)
                = max(work, dispatch)       on a GPU (the host launches ahead of the kernels)
    layer time  = max(transfer_s, compute)  with prefetch (the next layer's copy overlaps this
                                            layer's compute, as a copy stream does)
                = transfer_s + compute      without prefetch

    per-token decode time = sum of decode layer times + forward_call_s
    tokens_per_s          = B / per-token decode time
    prefill_s             = sum of prefill layer times + forward_call_s (one forward over the
                            prompt: all an encoder such as BERT ever runs)
    ttft_s                = prefill_s (the prompt's forward yields the first token; the
                            inference test times it so, from the prompt to that token)

On the CPU, with the profile's ``cpu_matmul_curve`` (``matmul_probe``: measured for the
detected profile), a plain Linear weight of ``W_t`` bytes is read in the curve's seconds for
its size and dtype, plus what a matmul call costs inside a forward over back to back (the
curve's ``context_s``), instead of ``W_t / (M * mbu)``: small weights never reach the
bandwidth. A quantized one is read in ``curve(P_t) x W_t / P_t / eff(cpu, p_t)``, ``P_t``
its 16-bit bytes: its kernel's efficiency is measured against that 16-bit kernel, not the
nominal bandwidth (bitsandbytes' nf4 on this project's 2-core CPU: 6.77 tok/s measured on
SmolLM2-135M, 23.7 predicted against the nominal bandwidth). The curve's prefill rate for the
prompt's row count (``prefill_rows_flops``, measured at 8, 32 and 128 rows and interpolated;
``prefill_flops``, the 128-row one, where a curve has no row points) replaces ``F * mfu`` in a
CPU layer's prefill compute, which adds to the layer's one-token ``read`` rather than
overlapping it, ``read + 2 N B P / rate``: the CPU's GEMM packs each weight as it reads it,
then multiplies the packed copy (each of SmolLM2-135M's Linear shapes takes its one-token
time plus its cache-hot time in a 37-token forward, within 5%; the larger of the two
predicted its 31-token TTFT at 47 ms, 73-85 measured). Below 8 rows its time rises linearly from the
one-token ``read`` to the 8-row time (on this project's CPU a 5-token bfloat16 prompt's
forward takes 1.3 decode steps). A ``Conv1D`` weight (GPT-2), stored
``(in, out)``, is read on the curve measured for that layout.

``e`` is the profile's ``elementwise_ns`` (``dispatch_probe``: a 576-wide Llama's elementwise
work per token over the square root of its layer's parameters, which scales with the layer's
width as the activations do; measured on this machine, typical elsewhere; 1.2-2.1 ns on this
project's CPU across measurements): SmolLM2-135M's layers take 2.3-3.2 us a prompt token for
it, 34-48 ms of a 496-token prefill, which the model left out before. On a GPU it is left
out (a bandwidth-bound kernel over kilobytes per token).
``module_call_s`` and ``forward_call_s`` are the profile's ``module_call_us`` and
``forward_call_us`` (``dispatch_probe``: measured on this machine, typical elsewhere); the
modules of a layer are its leaf modules (10 for a Llama layer). They are most of a small
model's decode step: SmolLM2-135M's 30 layers dispatch 300 module calls per token.

The one-word ``bottleneck`` names what most of the step waits for: the slowest link
(``"disk"`` or ``"host-to-device"``) when transfers outweigh compute; else ``"dispatch"`` when
the host's dispatch is most of the compute time; else ``"attention"`` when attention over
the cache is (a long context: SmolLM2-135M decoding after 4k tokens on this project's CPU,
58% of its step); else ``"memory"`` when the layers whose weight-read time ``W / (M * mbu)``
exceeds their FLOP time ``2 N B / (F * mfu)`` hold most of the compute time (decode at batch
1 almost always is), else ``"compute"``.

``F`` is the device's dense 16-bit TFLOP/s, ``M`` its memory bandwidth, ``BW_*`` the profile's
link bandwidths, all in decimal units; ``mfu`` (0.5) and ``mbu`` (0.8) are the fractions of
peak that real 16-bit kernels reach.

Precision: ``W_t`` are the stored bytes of each tensor at its precision ``p_t`` (the
``precisions`` map; plain dtypes without one), and ``eff(e, p)`` is the fraction of the 16-bit
kernel's bandwidth the kernel for ``p`` reaches on ``e``'s backend (``kernel_costs``: documented
for CUDA, measured for this CPU; the profile's ``kernel_costs``). A quantized weight is only
faster than 16-bit where its kernel keeps up with its smaller bytes: on this project's CPU,
torchao's int8 casts the weight to bf16 before every matmul and decodes at half the bf16 speed.

Host-to-device copies: ``BW_h2d`` is the pinned rate (``host_to_device_gbps``) when prefetch is
on, because the prefetcher pins each in-memory weight once and copies it on a side stream
(``big_modeling.hooks.prefetch``); without prefetch the hooks copy straight from pageable RAM
(``Tensor.to``), at ``BW_page`` (``HardwareProfile.pageable_gbps``: measured, given, or half
the pinned rate). Disk weights are pageable either way: the prefetcher pins a fresh copy of
each per forward, which is the staging the driver does for a pageable copy.

Context: a decode step's cache holds ``C = decode_context`` tokens (default: the prompt; an
inference run's prediction uses its prompt plus half the tokens it generated). Before the
attention terms, SmolLM2-135M on this project's 2-core AVX-512 CPU was predicted 20.0 tok/s
after a 2,000-token prompt where it decodes 12.8-13.2 (now 12.9-14.1), and a 1,365 ms TTFT
where it takes 2,651-2,789 (now 2,597-2,607): bfloat16 attention on that CPU reads its cache
at 1.3 GB/s. The terms need the model's ``AttentionLayout``: read from an ``OpenedModel``'s
config, or given with a tree.

Limits: activations moving between GPUs are ignored (kilobytes per token); one prefetch slot
is assumed (the overlap can never hide more than one layer's compute); disk reads assume the
page cache is cold; the first forward of a process pays one-time set-up (thread pools, kernel
primitives: SmolLM2-135M's 31-token prefill, its weights paged in, takes 64-80 ms the first
time and 54-57 ms after) that the model does not predict; CPU compute for CPU-only plans uses
the profile's CPU TFLOP/s and memory bandwidth.
The prediction is a floor for transfer-bound plans and a rough guide elsewhere; the app shows
it next to what it measures.

Example:
    >>> prediction = predict_speed(opened, {"": 0}, load_profile("h200-141gb"))  # doctest: +SKIP
    >>> round(prediction.tokens_per_s, 1)
    120.3
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.big_modeling.device_map.value import DeviceMap
from workbench.big_modeling.dtypes import dtype_name, to_dtype
from workbench.big_modeling.errors import BadInputError, DeviceMapError
from workbench.big_modeling.planning.attention_kinds import AttentionLayout, read_attention_layout
from workbench.big_modeling.quantization.dense_buffers import DENSE_COPY_KINDS
from workbench.big_modeling.quantization.sizes import precision_of
from workbench.models.attention_costs import (
    attention_by_module,
    attention_seconds,
    attention_shape,
)
from workbench.models.attention_probe import AttentionShape, AttentionTimes
from workbench.models.hardware import HardwareProfile
from workbench.models.kernel_costs import MEMORY_BANDWIDTH_UTILIZATION, KernelCosts, precision_kind
from workbench.models.matmul_probe import MatmulCurve
from workbench.models.tree import ModuleNode, ModuleTree

if TYPE_CHECKING:
    from workbench.models.intake import OpenedModel

__all__ = [
    "MEMORY_BANDWIDTH_UTILIZATION",
    "MODEL_FLOPS_UTILIZATION",
    "LayerPrediction",
    "SpeedPrediction",
    "attention_shapes_for",
    "layer_unit_names",
    "predict_speed",
]

MODEL_FLOPS_UTILIZATION = 0.5
GB = 1e9


@dataclass(frozen=True)
class LayerPrediction:
    """One layer's share of a decode step.

    Attributes:
        name: module name (``model.layers.3``).
        device: where its weights live (``0``, ``"cpu"``, ``"disk"``).
        nbytes: planning bytes of its weights.
        transfer_s: seconds to bring them to the execution device, per forward.
        compute_s: seconds of decode compute (one token) on the execution device.
        execution_device: where it runs.
        prefill_compute_s: seconds of compute for the whole prompt.
        time_s: the layer's contribution to one decode step (overlapped or summed).
        memory_bound: whether reading its weights from device memory takes longer than its
            decode FLOPs (``read > 2 N B / (F mfu)``).
        precision: the precision kind holding most of its bytes (``"plain"``, ``"int4"`` ...).
        dispatch_s: the host's seconds dispatching its module calls, per forward (in
            ``compute_s`` and ``prefill_compute_s``: added on the CPU, a floor on a GPU).
        attention_s: seconds of its attention in one decode step (in ``compute_s``).
        prefill_attention_s: seconds of its attention over the prompt (in
            ``prefill_compute_s``).
    """

    name: str
    device: int | str
    nbytes: int
    transfer_s: float
    compute_s: float
    execution_device: int | str = "cpu"
    prefill_compute_s: float = 0.0
    time_s: float = 0.0
    memory_bound: bool = False
    precision: str = "plain"
    dispatch_s: float = 0.0
    attention_s: float = 0.0
    prefill_attention_s: float = 0.0


@dataclass(frozen=True)
class SpeedPrediction:
    """The predicted speed of a plan.

    Attributes:
        tokens_per_s: decode throughput (batch tokens per second).
        ttft_s: time to first token for ``prompt_tokens``.
        per_layer: one ``LayerPrediction`` per layer, in model order.
        decode_s: seconds per decode step.
        transfer_s: seconds per step spent moving weights (before overlap).
        compute_s: seconds per step of compute (before overlap).
        bottleneck: ``"compute"``, ``"memory"``, ``"dispatch"``, ``"attention"`` or the
            slowest link (``"host-to-device"``, ``"disk"``), for a one-line summary.
        prefetch: whether transfers overlap compute.
        prompt_tokens: the prompt length used for ``ttft_s``.
        attention_s: seconds per step of attention over the cache (in ``compute_s``).
        prefill_s: seconds of one forward over ``prompt_tokens`` (``ttft_s``: that forward
            yields the first token): the figure for a model that runs one forward and
            generates nothing.
    """

    tokens_per_s: float
    ttft_s: float
    per_layer: list[LayerPrediction]
    decode_s: float = 0.0
    transfer_s: float = 0.0
    compute_s: float = 0.0
    bottleneck: str = "compute"
    prefetch: bool = True
    prompt_tokens: int = 128
    prefill_s: float = 0.0
    attention_s: float = 0.0

    @property
    def how(self) -> str:
        """What bounds it and whether prefetch is on: ``"memory-bound, prefetch on"``. A
        disk-bound prediction says its reads are cold (module docs: the page cache may hold
        the offloaded weights, and then runs are faster: SmolLM2-135M all on disk, predicted
        5.7 tok/s at this project's disk bandwidth, decodes at 13-17 from the page cache)."""
        bound = f"{self.bottleneck}-bound"
        if self.bottleneck == "disk":
            bound += " at cold reads, faster from the page cache"
        return f"{bound}, prefetch {'on' if self.prefetch else 'off'}"

    def summary(self, *, generates: bool = True) -> str:
        """One line: ``"0.41 tok/s, TTFT 12.3 s (memory-bound, prefetch on)"``; for a model
        that generates nothing (``generates=False``, an encoder such as BERT) the forward:
        ``"one forward over 128 tokens in 0.00231 s (compute-bound, prefetch on)"``."""
        how = f"({self.how})"
        if not generates:
            return f"one forward over {self.prompt_tokens} tokens in {self.prefill_s:.3g} s {how}"
        return f"{self.tokens_per_s:.3g} tok/s, TTFT {self.ttft_s:.3g} s {how}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens_per_s": self.tokens_per_s,
            "ttft_s": self.ttft_s,
            "decode_s": self.decode_s,
            "transfer_s": self.transfer_s,
            "compute_s": self.compute_s,
            "bottleneck": self.bottleneck,
            "prefetch": self.prefetch,
            "prompt_tokens": self.prompt_tokens,
            "prefill_s": self.prefill_s,
            "attention_s": self.attention_s,
            "per_layer": [layer.__dict__ for layer in self.per_layer],
        }


def predict_speed(
    opened_or_tree: OpenedModel | ModuleTree,
    device_map: Mapping[str, int | str],
    profile: HardwareProfile,
    *,
    prefetch: bool = True,
    prompt_tokens: int = 128,
    batch_size: int = 1,
    mfu: float = MODEL_FLOPS_UTILIZATION,
    mbu: float = MEMORY_BANDWIDTH_UTILIZATION,
    precisions: Mapping[str, str] | None = None,
    kernel_costs: KernelCosts | None = None,
    attention: AttentionLayout | None = None,
    attention_times: Mapping[str, AttentionTimes] | None = None,
    decode_context: int | None = None,
    last_position_only: bool | None = None,
) -> SpeedPrediction:
    """Predict per-token decode time and time to first token (formula in the module docs).

    Args:
        opened_or_tree: an ``OpenedModel`` or its ``ModuleTree`` (its tensor bytes are used:
            give the quantized sizes, ``runtime.precision_planning.with_tensor_sizes``).
        device_map: module name -> device, as planned (``""`` covers everything).
        profile: the hardware; every device in the map must be in it.
        prefetch: whether the next layer's weights are copied while this one computes.
        prompt_tokens: prompt length for the time to first token.
        batch_size: sequences decoded together.
        precisions: a precision map (module or prefix -> precision name, longest prefix wins,
            e.g. a plan's ``precision_map``) saying which kernel reads each Linear weight;
            other tensors, and ``None`` or uncovered, are plain dtypes.
        kernel_costs: each precision's kernel efficiency; default: the profile's.
        attention: the model's attention layout; default: read from an ``OpenedModel``'s
            config (a tree without it: no attention terms).
        attention_times: this CPU's measured attention by shape (``attention_probe``), used
            for layers that run on the CPU; others count FLOPs and bytes.
        decode_context: tokens in the KV cache during a decode step; default ``prompt_tokens``.
        last_position_only: the prefill computes the output head for the last position only
            (``generate``'s ``logits_to_keep=1``); default: for a model whose attention
            layout says it decodes (not encoder-only), else every position.

    Returns:
        A ``SpeedPrediction`` with a per-layer breakdown.

    Raises:
        DeviceMapError: when the map leaves a tensor without a device or uses a device the
            profile does not have.
    """
    tree = opened_or_tree if isinstance(opened_or_tree, ModuleTree) else opened_or_tree.tree
    layout = attention if attention is not None else _layout_of(opened_or_tree)
    placement = DeviceMap.of(device_map)
    missing_devices = sorted(
        {str(d) for d in placement.values() if d != "meta" and not profile.has_device(d)}
    )
    if missing_devices:
        raise DeviceMapError(
            f"device map uses {', '.join(missing_devices)}, which hardware profile "
            f"{profile.name!r} does not have; pick a profile with these devices or re-plan"
        )
    gpus = sorted(d for d in set(placement.values()) if isinstance(d, int))
    main_device: int | str = gpus[0] if gpus else "cpu"
    pinned_bw = profile.host_to_device_gbps * GB
    pageable_bw = profile.pageable_gbps * GB
    memory_h2d_bw = pinned_bw if prefetch else pageable_bw  # module docs: what our hooks copy
    disk_bw = profile.disk_read_gbps * GB
    costs = kernel_costs or profile.kernel_costs
    module_call_s = profile.module_call_us * 1e-6
    forward_call_s = profile.forward_call_us * 1e-6
    kinds: dict[str, str] = {}
    # every layer of a map without a GPU runs on the CPU: its Linear weights read on the curve
    curve = profile.cpu_matmul_curve if main_device == "cpu" else None
    cpu_read_bw = (
        max(profile.device("cpu").memory_bandwidth_gbps, 1e-3) * GB * mbu if curve else 0.0
    )

    units = _iter_layers(tree.root)
    attention_of = attention_by_module((u.name for u in units), layout) if layout else {}
    context = decode_context if decode_context is not None else prompt_tokens
    if last_position_only is None:
        last_position_only = layout is not None and not layout.encoder_only
    layers: list[LayerPrediction] = []
    uncovered: list[str] = []
    for unit in units:
        bytes_by_tier: dict[int | str, int] = {}
        bytes_by_kind: dict[str, int] = {}
        curve_s = 0.0  # Linear weights read in the curve's time
        curve_bytes: dict[str, int] = {}  # their bytes, by kind
        bytes_by_dtype: dict[Any, int] = {}  # floating bytes by the dtype they are counted in
        for tensor_name in _unit_tensors(unit):
            nbytes = tree.tensor_nbytes.get(tensor_name)
            if nbytes is None:  # a tied alias: counted under its first name
                continue
            _count_floating(tree, tensor_name, nbytes, bytes_by_dtype)
            tier = placement.device_for(tensor_name)
            if tier is None:
                uncovered.append(tensor_name)
                continue
            bytes_by_tier[tier] = bytes_by_tier.get(tier, 0) + nbytes
            kind = _tensor_kind(tree, tensor_name, precisions, kinds)
            seconds = _curve_seconds(tree, tensor_name, nbytes, curve, kind, costs, cpu_read_bw)
            if seconds is not None:
                curve_s += seconds
                curve_bytes[kind] = curve_bytes.get(kind, 0) + nbytes
            bytes_by_kind[kind] = bytes_by_kind.get(kind, 0) + nbytes
        if not bytes_by_tier:
            continue
        home = max(bytes_by_tier, key=lambda d: bytes_by_tier[d])
        execution = home if isinstance(home, int) else main_device
        transfer_s = 0.0
        for tier, nbytes in bytes_by_tier.items():
            if tier == "disk":
                transfer_s += nbytes / disk_bw
                if isinstance(execution, int):
                    transfer_s += nbytes / pageable_bw
            elif tier == "cpu" and isinstance(execution, int):
                transfer_s += nbytes / memory_h2d_bw
        nbytes = sum(bytes_by_tier.values())
        spec = profile.device(execution)
        flops_per_s = max(spec.compute_tflops, 1e-3) * 1e12 * mfu
        memory_bw = max(spec.memory_bandwidth_gbps, 1e-3) * GB * mbu
        weight_read_s = curve_s + sum(
            (kind_bytes - curve_bytes.get(kind, 0))
            / (memory_bw * costs.efficiency(execution, kind))
            for kind, kind_bytes in bytes_by_kind.items()
        )
        flops = 2.0 * _param_count(unit, tree) * batch_size
        rows = _prefill_rows(tree, unit, prompt_tokens, last_position_only)
        dispatch_s = _module_calls(unit) * module_call_s
        unit_dtype = _dominant_dtype(tree, unit, bytes_by_dtype)
        prefill_rate = _prefill_rate(curve, unit_dtype) or flops_per_s
        attended = attention_seconds(
            attention_of.get(unit.name),
            dtype=unit_dtype,
            batch=batch_size,
            context=context,
            prompt=prompt_tokens,
            flops_per_s=flops_per_s,
            prefill_flops_per_s=prefill_rate,
            memory_bytes_per_s=memory_bw,
            encoder_only=layout is not None and layout.encoder_only,
            times=attention_times if execution == "cpu" else None,
        )
        elementwise_s = (  # per token: norms, rotary, activation, residuals
            profile.elementwise_ns * 1e-9 * math.sqrt(unit.param_count) * batch_size
            if unit.no_split and execution == "cpu"
            else 0.0
        )
        decode_compute_s = _with_dispatch(
            max(flops / flops_per_s, weight_read_s) + attended.decode_s + elementwise_s,
            dispatch_s,
            execution,
        )
        cpu_curve = curve if execution == "cpu" else None
        prefill_matmul_s = _prefill_matmul_seconds(
            cpu_curve,
            unit_dtype,
            flops,
            rows,
            batch_size,
            weight_read_s,
            prefill_rate,
            # a walk over the block's modules, which only the CPU curve's layouts use
            transposed_share=_transposed_share(tree, unit) if cpu_curve is not None else 0.0,
        )
        prefill_compute_s = _with_dispatch(
            prefill_matmul_s + attended.prefill_s + elementwise_s * prompt_tokens,
            dispatch_s,
            execution,
        )
        time_s = max(transfer_s, decode_compute_s) if prefetch else transfer_s + decode_compute_s
        layers.append(
            LayerPrediction(
                name=unit.name,
                device=home,
                nbytes=nbytes,
                transfer_s=transfer_s,
                compute_s=decode_compute_s,
                execution_device=execution,
                prefill_compute_s=prefill_compute_s,
                time_s=time_s,
                memory_bound=weight_read_s > flops / flops_per_s,
                precision=max(bytes_by_kind, key=lambda k: bytes_by_kind[k]),
                dispatch_s=dispatch_s,
                attention_s=attended.decode_s,
                prefill_attention_s=attended.prefill_s,
            )
        )
    if uncovered:
        shown = ", ".join(sorted(uncovered)[:10])
        raise DeviceMapError(
            f"device map gives no device for {len(uncovered)} tensors: {shown}"
            f"{' ...' if len(uncovered) > 10 else ''}. Add a covering key or a '' entry."
        )

    def combine(transfer: float, compute: float) -> float:
        return max(transfer, compute) if prefetch else transfer + compute

    decode_s = sum(layer.time_s for layer in layers) + forward_call_s
    prefill_s = (
        sum(combine(layer.transfer_s, layer.prefill_compute_s) for layer in layers) + forward_call_s
    )
    transfer_total = sum(layer.transfer_s for layer in layers)
    compute_total = sum(layer.compute_s for layer in layers) + forward_call_s
    return SpeedPrediction(
        tokens_per_s=batch_size / decode_s if decode_s > 0 else float("inf"),
        ttft_s=prefill_s,
        per_layer=layers,
        decode_s=decode_s,
        transfer_s=transfer_total,
        compute_s=compute_total,
        bottleneck=_bottleneck(layers, transfer_total, compute_total, forward_call_s),
        prefetch=prefetch,
        prompt_tokens=prompt_tokens,
        prefill_s=prefill_s,
        attention_s=sum(layer.attention_s for layer in layers),
    )


def attention_shapes_for(tree: ModuleTree, layout: AttentionLayout) -> list[AttentionShape]:
    """The attention shapes ``predict_speed`` looks up in ``attention_times`` for ``tree``'s
    layers (each in its layer's dtype): what this CPU's ``attention_probe`` measures."""
    units = _iter_layers(tree.root)
    attention_of = attention_by_module((unit.name for unit in units), layout)
    shapes = (
        attention_shape(attention_of[unit.name], _unit_dtype(tree, unit))
        for unit in units
        if unit.name in attention_of
    )
    return list(dict.fromkeys(shape for shape in shapes if shape is not None))


def _count_floating(
    tree: ModuleTree, tensor_name: str, nbytes: int, bytes_by_dtype: dict[Any, int]
) -> None:
    """Add ``tensor_name``'s bytes under its dtype when it is a floating tensor."""
    dtype = tree.tensor_dtypes.get(tensor_name)
    if dtype is not None and dtype.is_floating_point:
        bytes_by_dtype[dtype] = bytes_by_dtype.get(dtype, 0) + nbytes


def _dominant_dtype(tree: ModuleTree, unit: ModuleNode, bytes_by_dtype: Mapping[Any, int]) -> str:
    """The dtype most of a layer's floating bytes are stored in, else ``_dtype_name``'s."""
    if bytes_by_dtype:
        return dtype_name(max(bytes_by_dtype, key=lambda d: bytes_by_dtype[d]))
    return _dtype_name(tree, unit.name)


def _unit_dtype(tree: ModuleTree, unit: ModuleNode) -> str:
    """``_dominant_dtype`` of a layer, walking its tensors (for ``attention_shapes_for``;
    ``predict_speed`` counts them in the walk it already makes)."""
    bytes_by_dtype: dict[Any, int] = {}
    for tensor_name in _unit_tensors(unit):
        nbytes = tree.tensor_nbytes.get(tensor_name)
        if nbytes is not None:
            _count_floating(tree, tensor_name, nbytes, bytes_by_dtype)
    return _dominant_dtype(tree, unit, bytes_by_dtype)


def _layout_of(opened_or_tree: OpenedModel | ModuleTree) -> AttentionLayout | None:
    """The attention layout of an ``OpenedModel``'s config (``None``: a tree, no config, or a
    config the layout reader rejects)."""
    config = getattr(opened_or_tree, "config", None)
    if config is None:
        return None
    try:
        return read_attention_layout(config, warn=False)
    except BadInputError:  # a config without heads or layers: no attention terms
        return None


def _tensor_kind(
    tree: ModuleTree, tensor: str, precisions: Mapping[str, str] | None, cache: dict[str, str]
) -> str:
    """The kernel kind reading ``tensor``: its module's precision in the map when it is a
    Linear weight (the only tensors quantization changes), else plain."""
    if not precisions:
        return "plain"
    module, _, attr = tensor.rpartition(".")
    if attr != "weight":
        return "plain"
    kind = cache.get(module)
    if kind is None:
        precision = precision_of(module, precisions)
        try:
            linear = "Linear" in tree.node(module).class_name
        except KeyError:
            linear = False
        kind = cache[module] = precision_kind(precision) if precision and linear else "plain"
    return kind


def _prefill_rate(curve: MatmulCurve | None, dtype: str) -> float | None:
    """The FLOP/s the CPU's matmul probe measured for a prefill in ``dtype``, the dtype most of
    a layer's bytes are counted in (``None``: no curve, or none for that dtype: the nominal
    TFLOP/s decide)."""
    if curve is None or not curve.prefill_flops:
        return None
    return curve.prefill_flops.get(dtype)


def _prefill_rows(tree: ModuleTree, unit: ModuleNode, tokens: int, last_position_only: bool) -> int:
    """The prompt positions a layer's matmuls run over in the prefill: all of them in a
    block; none for an embedding's lookup (a weight tied to the output head stands for the
    head: ``_unit_tensors`` counts a tied weight once); for the other modules outside the
    blocks (the output head, a final norm) the last position when ``last_position_only``,
    else all. Counted as ``tokens`` rows, a 496-token prompt's prefill charged SmolLM2-135M's
    tied embedding 77 ms of matmul for a head that computes one row, 4 ms."""
    if unit.no_split:
        return tokens
    if _is_embedding(tree, unit.name) and not unit.tied:
        return 0
    return 1 if last_position_only else tokens


def _is_embedding(tree: ModuleTree, module: str) -> bool:
    try:
        return "Embedding" in tree.node(module).class_name
    except KeyError:
        return False


def _transposed_share(tree: ModuleTree, unit: ModuleNode) -> float:
    """The share of a layer's parameters in ``Conv1D`` modules (GPT-2's ``(in, out)``
    weights, ``x @ W``), whose prefill runs at the curve's rate for that layout."""
    total = _param_count(unit, tree)
    if total <= 0:
        return 0.0
    nodes = _unit_modules(unit) if unit.no_split else [unit]
    transposed = sum(node.param_count for node in nodes if node.class_name == "Conv1D")
    return min(transposed / total, 1.0)


def _prefill_matmul_seconds(
    curve: MatmulCurve | None,
    dtype: str,
    flops: float,
    tokens: int,
    batch: int,
    read_s: float,
    rate: float,
    *,
    transposed_share: float = 0.0,
) -> float:
    """A layer's prefill matmuls over ``tokens`` (``flops`` per token, batch included).

    With the CPU curve's row points: its one-token read ``read_s`` plus its FLOPs at the
    curve's rate for that many rows (``prefill_flops_at``); below the first measured row
    count, from ``read_s`` at one token rising linearly to that count's time. The two add on
    the CPU: the GEMM first packs the weight it reads from memory, then multiplies the packed
    copy (SmolLM2-135M's bfloat16 Linears in a 37-token forward on this project's CPU take
    their one-token time plus their time on a cache-hot weight, within 5% per shape: 209 us
    for a 576 x 576 weight, 105 + 89; the larger of the two, which this took before,
    predicted its 37-token forward at 48.7 ms against 62-66 measured).

    The ``transposed_share`` of the FLOPs (``Conv1D`` weights) runs at the curve's rate for
    that layout where it has one (``transposed_prefill_rows_flops``: float16 ``x @ W`` runs at
    about 3 GFLOP/s on this project's CPU, 10x below ``linear``; GPT-2's 15-token TTFT was
    predicted 125 ms where it takes 620).

    Without rows measured (a GPU, or no curve): the roofline ``max(flops x tokens / rate,
    read_s)``. No tokens (an embedding's lookup): ``read_s``.
    """
    if tokens <= 0:
        return read_s
    rows = max(tokens * batch, 1)
    first = curve.prefill_rows_flops.get(dtype) if curve is not None else None
    if not first:
        return max(flops * tokens / rate, read_s)

    def seconds_per_row_flop(at_rows: int) -> float:
        plain = 1.0 / (curve.prefill_flops_at(dtype, at_rows) or rate)
        flipped = curve.prefill_flops_at(dtype, at_rows, transposed=True)
        if not transposed_share or not flipped:
            return plain
        return (1.0 - transposed_share) * plain + transposed_share / flipped

    first_rows = int(first[0][0])
    if rows >= first_rows:
        return read_s + flops * tokens * seconds_per_row_flop(rows)
    at_first = read_s + flops / batch * first_rows * seconds_per_row_flop(first_rows)
    return read_s + (at_first - read_s) * (rows - 1) / (first_rows - 1)


def _curve_seconds(
    tree: ModuleTree,
    tensor: str,
    nbytes: int,
    curve: MatmulCurve | None,
    kind: str = "plain",
    costs: KernelCosts | None = None,
    read_bw: float = 0.0,
) -> float | None:
    """The CPU matmul curve's seconds for ``tensor`` when it is a Linear weight (``None``:
    no curve, another tensor, or a dtype the curve has no points for).

    A quantized weight (``kind`` not plain) of ``nbytes`` stored and ``P`` bytes at 16 bits
    runs at ``eff`` of the 16-bit kernel's rate (``eff`` is measured against that kernel on a
    large weight: ``device_probe``, ``kernel_costs``), so it takes ``nbytes / eff`` where the
    16-bit kernel takes ``P``, at the CPU's read rate ``read_bw`` (``M x mbu``):

    - nf4/fp4/int8 (``DENSE_COPY_KINDS``): the weight is dequantized into a dense buffer, then
      one 16-bit matmul runs on it, so ``curve(P) + max(nbytes / eff - P, 0) / read_bw``: the
      dequantization is the extra time, and the matmul follows the curve at every size (the
      product ``curve(P) x nbytes / P / eff`` scaled a small weight's fixed per-call cost by
      the large weight's dequantize ratio: SmolLM2-135M in nf4 predicted 12.4 tok/s on this
      project's AVX-512 CPU, 16.4 measured; 16.0 this way);
    - other kinds (a fused kernel such as int4's tinygemm): ``curve(P) x nbytes / P / eff``.
    """
    if curve is None:
        return None
    module, _, attr = tensor.rpartition(".")
    if attr != "weight" or not _is_linear(tree, module):
        return None
    dtype = _dtype_name(tree, module)
    transposed = tree.node(module).class_name == "Conv1D"  # (in, out) storage, x @ W
    if kind == "plain":
        return curve.call_seconds(nbytes, dtype, transposed=transposed)
    plain = tree.node(module).param_count * to_dtype(dtype).itemsize
    seconds = curve.call_seconds(plain, dtype, transposed=transposed) if plain > 0 else None
    if seconds is None or costs is None:
        return None
    efficiency = costs.efficiency("cpu", kind)
    if kind in DENSE_COPY_KINDS and read_bw > 0:
        return seconds + max(nbytes / efficiency - plain, 0.0) / read_bw
    return seconds * nbytes / plain / efficiency


def _is_linear(tree: ModuleTree, module: str) -> bool:
    """Whether ``module`` is a matmul layer (``nn.Linear`` and its kin, GPT-2's ``Conv1D``)."""
    try:
        class_name = tree.node(module).class_name
    except KeyError:
        return False
    return "Linear" in class_name or class_name == "Conv1D"


def _dtype_name(tree: ModuleTree, module: str) -> str:
    """The dtype a module's weight is counted in: the tree's planning dtype, else the dtype its
    weight is stored in (``tree.tensor_dtypes``: a float16 checkpoint runs its float16
    kernels, on this project's AVX-512 CPU two to three times faster than bfloat16's at
    decode sizes), else by its bytes per parameter (2: bfloat16, the usual 16-bit checkpoint;
    4: float32)."""
    if tree.planning_dtype is not None:
        return dtype_name(tree.planning_dtype)
    stored = tree.tensor_dtypes.get(f"{module}.weight" if module else "weight")
    if stored is not None and stored.is_floating_point:
        return dtype_name(stored)
    node = tree.node(module)
    per_param = node.nbytes / node.param_count if node.param_count else 2
    return "float32" if per_param >= 4 else "bfloat16"


def _with_dispatch(work_s: float, dispatch_s: float, execution: int | str) -> float:
    """A layer's compute: its work plus the host's dispatch on the CPU, which does both; on a
    GPU the host launches ahead, so whichever is longer."""
    return max(work_s, dispatch_s) if isinstance(execution, int) else work_s + dispatch_s


def _module_calls(unit: ModuleNode) -> int:
    """The module calls one forward makes in a layer: a block's leaf modules, else one."""
    if not unit.no_split:
        return 1
    return sum(1 for node in _unit_modules(unit) if not node.children)


def _unit_modules(unit: ModuleNode) -> list[ModuleNode]:
    """``unit`` and every module under it."""
    nodes, stack = [], [unit]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children)
    return nodes


def _bottleneck(
    layers: list[LayerPrediction], transfer_s: float, compute_s: float, forward_call_s: float
) -> str:
    if transfer_s > compute_s:
        disk_s = sum(layer.transfer_s for layer in layers if layer.device == "disk")
        return "disk" if disk_s > transfer_s / 2 else "host-to-device"
    if forward_call_s + sum(_host_share(layer) for layer in layers) > compute_s / 2:
        return "dispatch"
    if sum(layer.attention_s for layer in layers) > compute_s / 2:
        return "attention"
    memory_s = sum(layer.compute_s for layer in layers if layer.memory_bound)
    return "memory" if memory_s > compute_s / 2 else "compute"


def _host_share(layer: LayerPrediction) -> float:
    """The part of a layer's decode compute the host's dispatch accounts for: all of its
    dispatch on the CPU; on a GPU its whole compute when the dispatch is the longer."""
    if isinstance(layer.execution_device, int):
        return layer.compute_s if layer.dispatch_s >= layer.compute_s else 0.0
    return layer.dispatch_s


def layer_unit_names(tree: ModuleTree) -> list[str]:
    """The modules the speed model predicts one row for (``SpeedPrediction.per_layer``): the
    no-split blocks and, outside them, the modules holding tensors directly."""
    return [unit.name for unit in _iter_layers(tree.root)]


def _iter_layers(root: ModuleNode) -> list[ModuleNode]:
    """Return the no-split blocks and, outside them, modules holding tensors directly."""
    units: list[ModuleNode] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.no_split and node is not root:
            units.append(node)
            continue
        if node.tensor_names:
            units.append(node)
        stack.extend(reversed(node.children))
    return units


def _unit_tensors(unit: ModuleNode) -> list[str]:
    if not unit.no_split:
        return unit.tensor_names
    names: list[str] = []
    stack = [unit]
    while stack:
        node = stack.pop()
        names.extend(node.tensor_names)
        stack.extend(node.children)
    return names


def _param_count(unit: ModuleNode, tree: ModuleTree) -> int:
    if unit.no_split:
        return unit.param_count
    direct = unit.param_count - sum(child.param_count for child in unit.children)
    return max(direct, 0)
