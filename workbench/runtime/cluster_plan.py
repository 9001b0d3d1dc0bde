"""Plan a model across a cluster: tensor parallel inside a node, pipeline stages across nodes
or GPUs, an uneven layer partition, memory per device and predicted speed, with a trace.

For each tensor-parallel size ``tp`` (it divides the attention heads and fits in a node) the
GPUs form groups of ``tp`` consecutive GPUs of one node; for each pipeline size ``pp`` (up to
the number of groups) stage ``s`` runs on group ``s``. Per device of stage ``s``::

    weights     = (layers_s + embeddings if s == 0 + norm/lm_head if s == last) / tp
    kv_cache    = sum over layers_s of the engine's per-layer cache per rank
                  (ModelLayout.kv_cache_bytes: GQA 2 * batch * context * ceil(kv_heads / tp)
                  * head_dim * b_kv; MLA batch * context * (kv_lora_rank + rope) * b_kv whole)
    activations = prefill peak of one chunk / tp            (ModelLayout.activation_bytes)
    overhead    = ENGINE_OVERHEAD_BYTES[engine]
    total       <= budget = min(MAX_UTILIZATION * memory, memory - used)

Speed (per stage, summed along the pipeline for one batch; ``F``/``M`` the GPU's TFLOP/s and
memory GB/s, ``mfu``/``mbu`` as in ``workbench.models.speed``)::

    layer decode  = max(2 N B / (tp F mfu), (W / tp + kv_read) / (M mbu)) + 2 all-reduces
                    (MoE: N the active parameters, W the dense part plus the experts the B
                    tokens touch, ModelLayout.active_params / read_nbytes)
    all-reduce    = 2 (tp - 1) / tp * B * hidden * b / BW_link + 2 (tp - 1) * latency_link
    boundary      = B * hidden * b / BW + latency   (intra-node link, or the network)
    decode tok/s  = B / (sum of stage times + boundaries)
    pipelined     = B / (slowest stage + its boundary)  (pp batches in flight)
    prefill tok/s = B P / (same sums with P prompt tokens; compute-bound terms scale by P)

The layer partition minimises the slowest stage's decode time subject to every stage fitting
its budget (binary search on the time; for a given time the greedy "as many layers as fit"
partition is feasible whenever any is), so ``lm_head`` on the last stage and smaller GPUs get
fewer layers. Candidates are sorted: fitting first, then by decode tok/s, then by fewer GPUs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from workbench.big_modeling.dtypes import dtype_name
from workbench.big_modeling.errors import BadInputError
from workbench.models.cluster import ClusterProfile, GPUSpec, LinkSpec
from workbench.models.speed import MEMORY_BANDWIDTH_UTILIZATION, MODEL_FLOPS_UTILIZATION
from workbench.runtime.cluster_layout import ModelLayout
from workbench.runtime.cluster_partition import partition_layers

ENGINES = ("vllm", "sglang", "llama.cpp", "torch")
GIB = 2**30
# Memory an engine holds on every GPU besides weights, KV cache and activations (estimates):
ENGINE_OVERHEAD_BYTES: dict[str, int] = {
    # CUDA context and torch (~0.6 GiB), NCCL buffers (~0.4 GiB), CUDA graphs for the decode
    # batch sizes it captures (~1-2 GiB, the "Graph capturing finished ... took X GiB" line).
    "vllm": int(2.5 * GIB),
    # The same CUDA context / NCCL share, CUDA graphs up to --cuda-graph-max-bs.
    "sglang": int(2.5 * GIB),
    # CUDA context and the compute buffer llama.cpp allocates per device ("compute buffer size").
    "llama.cpp": int(0.5 * GIB),
    # A CPU process: the Python interpreter with torch and transformers imported (measured RSS
    # of `python -c "import torch, transformers"` is 0.3-0.5 GiB).
    "torch": int(0.4 * GIB),
}
MAX_UTILIZATION = 0.95  # leave 5% of each GPU for fragmentation and the allocator
DEFAULT_CHUNK_TOKENS = 2048
# --kv-cache-dtype values and the cache dtype each means (None: the model's compute dtype)
KV_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage on one tensor-parallel group. Byte figures are per device."""

    index: int
    node: int
    node_name: str
    gpus: tuple[int, ...]
    first_layer: int
    layer_count: int
    modules: tuple[str, ...]
    weights_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    overhead_bytes: int
    budget_bytes: int
    memory_bytes: int
    decode_s: float
    prefill_s: float

    @property
    def total_bytes(self) -> int:
        return (
            self.weights_bytes + self.kv_cache_bytes + self.activation_bytes + self.overhead_bytes
        )

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.budget_bytes

    @property
    def layer_range(self) -> range:
        return range(self.first_layer, self.first_layer + self.layer_count)


@dataclass(frozen=True)
class ClusterCandidate:
    """One (tp, pp) choice with its partition, memory and predicted speed."""

    tp: int
    pp: int
    stages: tuple[StagePlan, ...]
    decode_tokens_per_s: float
    pipelined_tokens_per_s: float
    prefill_tokens_per_s: float
    ttft_s: float  # the prompt's forward through every stage and hop: it yields the first token
    trace: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return all(stage.fits for stage in self.stages)

    @property
    def gpus_used(self) -> int:
        return self.tp * self.pp

    @property
    def label(self) -> str:
        return f"TP{self.tp} x PP{self.pp}"

    @property
    def layer_partition(self) -> tuple[int, ...]:
        return tuple(stage.layer_count for stage in self.stages)


@dataclass(frozen=True)
class ClusterPlan:
    """All candidates for a model on a cluster, best first, and the settings they share."""

    model: str
    cluster: ClusterProfile
    engine: str
    context_tokens: int
    batch_size: int
    prompt_tokens: int
    chunk_tokens: int
    kv_cache_dtype: str
    weight_dtype: str
    candidates: tuple[ClusterCandidate, ...]
    trace: tuple[str, ...] = field(default=())

    @property
    def best(self) -> ClusterCandidate | None:
        """The first fitting candidate, or ``None`` when nothing fits."""
        return self.candidates[0] if self.candidates and self.candidates[0].fits else None

    def to_dict(self) -> dict[str, Any]:
        def candidate(c: ClusterCandidate) -> dict[str, Any]:
            data = asdict(c)
            data["fits"] = c.fits
            data["label"] = c.label
            for stage, raw in zip(c.stages, data["stages"], strict=True):
                raw["total_bytes"] = stage.total_bytes
                raw["fits"] = stage.fits
            return data

        return {
            "model": self.model,
            "cluster": self.cluster.name,
            "engine": self.engine,
            "context_tokens": self.context_tokens,
            "batch_size": self.batch_size,
            "prompt_tokens": self.prompt_tokens,
            "chunk_tokens": self.chunk_tokens,
            "kv_cache_dtype": self.kv_cache_dtype,
            "weight_dtype": self.weight_dtype,
            "best": self.best.label if self.best else None,
            "trace": list(self.trace),
            "candidates": [candidate(c) for c in self.candidates],
        }


@dataclass(frozen=True)
class _Group:
    node: int
    node_name: str
    gpus: tuple[int, ...]
    spec: GPUSpec  # the weakest GPU of the group: its memory and speeds bound the group
    link: LinkSpec


def plan_cluster(
    layout: ModelLayout,
    cluster: ClusterProfile,
    *,
    engine: str = "vllm",
    context_tokens: int | None = None,
    batch_size: int = 1,
    prompt_tokens: int | None = None,
    kv_cache_dtype: str = "auto",
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    tp_sizes: tuple[int, ...] | None = None,
) -> ClusterPlan:
    """Plan ``layout`` on ``cluster`` for ``engine`` (see the module docs for the arithmetic).

    Args:
        layout: the model (``ModelLayout.from_opened(open_model(...))``).
        cluster: the cluster profile.
        engine: ``"vllm"``, ``"sglang"``, ``"llama.cpp"`` (layer split only, TP 1) or
            ``"torch"`` (``torch.distributed.pipelining``, TP 1).
        context_tokens: tokens per sequence the KV cache holds; default the model's maximum
            (as vLLM's ``--max-model-len`` defaults), else 4096.
        batch_size: concurrent sequences.
        prompt_tokens: prompt length for prefill speed (default ``min(2048, context)``).
        kv_cache_dtype: ``"auto"`` (the weights' dtype) or ``"fp8"``.
        chunk_tokens: prefill chunk the activations are sized for.
        tp_sizes: restrict the tensor-parallel sizes tried.

    Returns:
        A ``ClusterPlan`` with every candidate, best first.

    Raises:
        BadInputError: unknown engine or KV dtype, non-positive sizes.
    """
    if engine not in ENGINES:
        raise BadInputError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if kv_cache_dtype not in KV_DTYPES:
        raise BadInputError(
            f"unknown KV cache dtype {kv_cache_dtype!r}; choose one of {', '.join(KV_DTYPES)}"
        )
    context = context_tokens or layout.max_positions or 4096
    prompt = prompt_tokens or min(2048, context)
    if min(context, batch_size, prompt, chunk_tokens) <= 0:
        raise BadInputError(
            f"context, batch, prompt and chunk must be positive, got {context}, {batch_size}, "
            f"{prompt}, {chunk_tokens}"
        )
    kv_dtype = KV_DTYPES[kv_cache_dtype] or layout.compute_dtype
    kv_b = torch.empty((), dtype=kv_dtype).element_size()
    trace = [
        f"{layout.name}: {layout.num_layers} layers, {layout.total_nbytes / 1e9:.1f} GB of "
        f"weights in {str(layout.weight_dtype).removeprefix('torch.')}; KV cache for "
        f"{batch_size} x {context} tokens in {kv_b:g}-byte elements; activations for a "
        f"{chunk_tokens}-token prefill chunk; {engine} overhead "
        f"{ENGINE_OVERHEAD_BYTES[engine] / GIB:.1f} GiB per GPU",
    ]
    trace += _model_notes(layout, batch_size, context, kv_dtype, engine)
    sizes = tp_sizes or _tp_sizes(layout, cluster, engine, trace)
    candidates = []
    for tp in sizes:
        groups = _groups(cluster, tp)
        for pp in range(1, min(len(groups), layout.num_layers) + 1):
            candidates.append(
                _plan_candidate(
                    layout,
                    groups[:pp],
                    tp,
                    engine,
                    context,
                    batch_size,
                    prompt,
                    kv_dtype,
                    chunk_tokens,
                    cluster,
                )
            )
    candidates.sort(key=lambda c: (not c.fits, -c.decode_tokens_per_s, c.gpus_used))
    if candidates and candidates[0].fits:
        best = candidates[0]
        trace.append(
            f"chosen {best.label}: the fastest fitting candidate, {best.decode_tokens_per_s:.3g} "
            f"tok/s decode at batch {batch_size}"
        )
    else:
        trace.append("no candidate fits: add GPUs, shorten the context or quantize the weights")
    return ClusterPlan(
        model=layout.name,
        cluster=cluster,
        engine=engine,
        context_tokens=context,
        batch_size=batch_size,
        prompt_tokens=prompt,
        chunk_tokens=chunk_tokens,
        kv_cache_dtype=kv_cache_dtype,
        weight_dtype=dtype_name(layout.weight_dtype),
        candidates=tuple(candidates),
        trace=tuple(trace),
    )


def _model_notes(
    layout: ModelLayout, batch: int, context: int, kv_dtype: torch.dtype, engine: str
) -> list[str]:
    """Trace lines for what changes the arithmetic: an MLA cache, mixture-of-experts reads."""
    notes = []
    kinds = {layer.kind for layer in layout.attention.layers} if layout.attention else set()
    if "mla" in kinds:
        per_layer = layout.kv_cache_bytes(batch, context, kv_dtype, 1, engine)
        mla = next(layer.mla for layer in layout.attention.layers if layer.mla)  # type: ignore[union-attr]
        notes.append(
            f"MLA: {engine} caches the compressed latent, {mla.kv_lora_rank} + "
            f"{mla.qk_rope_head_dim} elements per token and layer "
            f"({max(per_layer) / GIB:.2f} GiB per layer for {batch} x {context} tokens), whole "
            "on every TP rank: more TP does not shrink it, more pipeline stages do"
        )
    if layout.is_moe:
        notes.append(
            f"MoE: {layout.experts_per_token} of {layout.num_experts} routed experts per token; "
            f"every expert is held, a decode step at batch {batch} reads "
            f"{layout.expert_read_fraction(batch):.0%} of them, a prefill all"
        )
    return notes


def _tp_sizes(
    layout: ModelLayout, cluster: ClusterProfile, engine: str, trace: list[str]
) -> tuple[int, ...]:
    if engine in ("llama.cpp", "torch"):
        trace.append(f"TP 1 only: {engine} splits by layers (each device is a pipeline stage)")
        return (1,)
    widest = max(len(node.gpus) for node in cluster.nodes)
    sizes = tuple(
        tp for tp in range(1, widest + 1) if layout.num_heads % tp == 0 and (tp & (tp - 1)) == 0
    )
    trace.append(
        f"TP sizes {', '.join(map(str, sizes))}: powers of two dividing the {layout.num_heads} "
        f"attention heads, at most the {widest} GPUs of one node; TP never spans nodes (two "
        f"all-reduces per layer would cross the {cluster.network.bandwidth_gbps * 8:g} Gb/s "
        "network), so pipeline stages do"
    )
    return sizes


def _groups(cluster: ClusterProfile, tp: int) -> list[_Group]:
    groups = []
    for n, node in enumerate(cluster.nodes):
        for start in range(0, len(node.gpus) - tp + 1, tp):
            members = node.gpus[start : start + tp]
            weakest = GPUSpec(
                name=" + ".join(sorted({gpu.name for gpu in members})),
                memory_bytes=min(gpu.memory_bytes for gpu in members),
                used_bytes=max(gpu.used_bytes for gpu in members),
                compute_tflops=min(gpu.compute_tflops for gpu in members),
                memory_bandwidth_gbps=min(gpu.memory_bandwidth_gbps for gpu in members),
            )
            groups.append(
                _Group(n, node.name, tuple(range(start, start + tp)), weakest, node.intra_link)
            )
    return groups


def budget_bytes(gpu: GPUSpec) -> int:
    """What a plan may use on ``gpu``: ``min(MAX_UTILIZATION * memory, memory - used)``."""
    return min(int(MAX_UTILIZATION * gpu.memory_bytes), gpu.free_bytes)


def _allreduce_s(nbytes: float, tp: int, link: LinkSpec) -> float:
    if tp == 1:
        return 0.0
    return 2 * (tp - 1) / tp * nbytes / (link.bandwidth_gbps * 1e9) + 2 * (tp - 1) * link.latency_s


def _layer_s(
    params: int, nbytes: int, kv_read: float, tokens: int, tp: int, group: _Group, act_bytes: float
) -> float:
    flops_s = (
        2 * params * tokens / (tp * group.spec.compute_tflops * 1e12 * MODEL_FLOPS_UTILIZATION)
    )
    read_s = (nbytes / tp + kv_read) / (
        group.spec.memory_bandwidth_gbps * 1e9 * MEMORY_BANDWIDTH_UTILIZATION
    )
    return max(flops_s, read_s) + 2 * _allreduce_s(act_bytes * tokens, tp, group.link)


def _plan_candidate(
    layout: ModelLayout,
    groups: list[_Group],
    tp: int,
    engine: str,
    context: int,
    batch: int,
    prompt: int,
    kv_dtype: torch.dtype,
    chunk: int,
    cluster: ClusterProfile,
) -> ClusterCandidate:
    pp = len(groups)
    n = layout.num_layers
    kv_layer = layout.kv_cache_bytes(batch, context, kv_dtype, tp, engine)
    activations = layout.activation_bytes(chunk, layout.compute_dtype, tp)
    overhead = ENGINE_OVERHEAD_BYTES[engine]
    # one token's hidden state per sequence, in the compute dtype
    token_bytes = batch * layout.hidden_size * layout.compute_dtype.itemsize

    def fixed(s: int) -> tuple[int, int, int]:
        """(bytes held, params computed, bytes read per token) of the embeddings/head on
        stage ``s``: an embedding lookup reads one row per token, so it costs memory, not time;
        the head is a full matmul (a tied head included)."""
        held = params = read = 0
        if s == 0:
            held += layout.pre_nbytes
        if s == pp - 1:
            held += layout.post_nbytes + (layout.tied_head_nbytes if pp > 1 else 0)
            params += layout.post_params
            read += layout.post_nbytes + layout.tied_head_nbytes
        return held, params, read

    def decode_layer(i: int, g: _Group) -> float:
        return _layer_s(
            layout.active_params(i),
            layout.read_nbytes(i, batch),
            kv_layer[i],
            batch,
            tp,
            g,
            token_bytes,
        )

    layer_mem = [
        math.ceil(nbytes / tp) + kv
        for nbytes, kv in zip(layout.layer_nbytes, kv_layer, strict=True)
    ]
    stage_fixed_mem = [math.ceil(fixed(s)[0] / tp) + activations + overhead for s in range(pp)]
    stage_fixed_time = [
        _layer_s(fixed(s)[1], fixed(s)[2], 0, batch, tp, groups[s], 0) for s in range(pp)
    ]
    layer_time = [[decode_layer(i, g) for i in range(n)] for g in groups]
    budgets = [budget_bytes(g.spec) for g in groups]

    counts = partition_layers(n, layer_mem, layer_time, stage_fixed_mem, stage_fixed_time, budgets)
    memory_bound = counts is not None
    if counts is None:  # does not fit: balance time alone, then report the overflow
        counts = partition_layers(n, layer_mem, layer_time, stage_fixed_mem, stage_fixed_time, None)
    assert counts is not None
    stages = []
    first = 0
    decode_total = prefill_total = 0.0
    slowest = 0.0
    for s, (group, count) in enumerate(zip(groups, counts, strict=True)):
        layers = range(first, first + count)
        fixed_bytes, fixed_params, fixed_read = fixed(s)
        decode_s = stage_fixed_time[s] + sum(layer_time[s][i] for i in layers)
        prefill_s = _layer_s(fixed_params, fixed_read, 0, batch * prompt, tp, group, 0) + sum(
            _layer_s(
                layout.active_params(i),
                layout.read_nbytes(i, batch * prompt),
                0,
                batch * prompt,
                tp,
                group,
                token_bytes,
            )
            for i in layers
        )
        boundary = _boundary_link(groups, s, cluster)
        hop_decode = hop_prefill = 0.0
        if boundary is not None:
            hop_decode = token_bytes / (boundary.bandwidth_gbps * 1e9) + boundary.latency_s
            hop_prefill = (
                token_bytes * prompt / (boundary.bandwidth_gbps * 1e9) + boundary.latency_s
            )
        decode_total += decode_s + hop_decode
        prefill_total += prefill_s + hop_prefill
        slowest = max(slowest, decode_s + hop_decode)
        modules = (layout.pre_names if s == 0 else ()) + tuple(
            layout.layer_names[i] for i in layers
        )
        if s == pp - 1:
            modules += layout.post_names
        stages.append(
            StagePlan(
                index=s,
                node=group.node,
                node_name=group.node_name,
                gpus=group.gpus,
                first_layer=first,
                layer_count=count,
                modules=modules,
                weights_bytes=math.ceil(fixed_bytes / tp)
                + sum(math.ceil(layout.layer_nbytes[i] / tp) for i in layers),
                kv_cache_bytes=sum(kv_layer[i] for i in layers),
                activation_bytes=activations,
                overhead_bytes=overhead,
                budget_bytes=budgets[s],
                memory_bytes=group.spec.memory_bytes,
                decode_s=decode_s,
                prefill_s=prefill_s,
            )
        )
        first += count
    candidate_trace = _candidate_trace(layout, tp, pp, stages, memory_bound, groups)
    return ClusterCandidate(
        tp=tp,
        pp=pp,
        stages=tuple(stages),
        decode_tokens_per_s=batch / decode_total,
        pipelined_tokens_per_s=batch / slowest,
        prefill_tokens_per_s=batch * prompt / prefill_total,
        ttft_s=prefill_total,  # the prompt's forward through every stage yields the first token
        trace=candidate_trace,
    )


def _boundary_link(groups: list[_Group], s: int, cluster: ClusterProfile) -> LinkSpec | None:
    """The link stage ``s`` sends its hidden states over (``None`` for the last stage)."""
    if s == len(groups) - 1:
        return None
    if groups[s].node == groups[s + 1].node:
        return groups[s].link
    return cluster.network


def _candidate_trace(
    layout: ModelLayout,
    tp: int,
    pp: int,
    stages: list[StagePlan],
    memory_bound: bool,
    groups: list[_Group],
) -> tuple[str, ...]:
    lines = []
    per_device = layout.total_nbytes / (tp * pp)
    lines.append(
        f"{tp * pp} GPUs: {layout.total_nbytes / 1e9:.1f} GB / {tp * pp} = {per_device / 1e9:.1f} "
        "GB of weights per GPU on average"
    )
    if not memory_bound:
        worst = max(stages, key=lambda stage: stage.total_bytes - stage.budget_bytes)
        lines.append(
            f"does not fit: stage {worst.index} needs {worst.total_bytes / GIB:.1f} GiB per GPU, "
            f"budget {worst.budget_bytes / GIB:.1f} GiB on {groups[worst.index].spec.name}"
        )
    counts = [stage.layer_count for stage in stages]
    if pp > 1 and len(set(counts)) > 1:
        lines.append(
            f"uneven partition {','.join(map(str, counts))}: stage 0 holds the embeddings "
            f"({layout.pre_nbytes / 1e9:.2f} GB), the last stage the norm and lm_head "
            f"({(layout.post_nbytes + layout.tied_head_nbytes) / 1e9:.2f} GB); layers move "
            "off the stages with the most to hold or the slowest GPUs"
        )
    crossings = sum(1 for a, b in itertools.pairwise(stages) if a.node != b.node)
    if crossings:
        lines.append(
            f"{crossings} stage boundary(ies) cross the network (one hidden state per token)"
        )
    return tuple(lines)
