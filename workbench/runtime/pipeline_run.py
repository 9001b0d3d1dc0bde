"""Run a planned pipeline partition for real with ``torch.distributed.pipelining`` on CPU.

Each stage is one process in a gloo process group (``torch.multiprocessing`` spawn on this
machine; the same code runs across nodes given ``nnodes``/``node_rank``/``master_addr``, one
process per local stage, as ``torchrun --nproc-per-node`` would start them). A process builds
the empty model, keeps only its stage's modules (embeddings on the first, norm and ``lm_head``
on the last) and loads exactly those tensors from the checkpoint with our engine
(``load_checkpoint_in_model``: other stages' tensors are skipped, never read). PyTorch's own
``PipelineStage`` and ``ScheduleGPipe`` move the hidden states between processes.

Greedy generation runs without a KV cache on a fixed-length input (prompt plus the new tokens,
padded on the right): causal attention makes the logits at a position independent of what
follows it, so every step has the same shapes and the stages' shape inference runs once. After
each step the last stage broadcasts the chosen token to every stage.

Supported: Llama-style causal LMs (``model.embed_tokens``, ``model.layers``, ``model.norm``,
``model.rotary_emb``, ``lm_head``), which covers the demo models and Llama/Mistral/Qwen.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from torch import nn

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.json_files import read_json
from workbench.big_modeling.loading.api import load_checkpoint_in_model
from workbench.models.cluster import cluster_from_dict
from workbench.models.intake import open_model
from workbench.runtime.cluster_layout import ModelLayout
from workbench.runtime.cluster_plan import plan_cluster

RESULT_NAME = "stage{rank}.json"
LOGITS_NAME = "first_logits.safetensors"


@dataclass(frozen=True)
class StageSpec:
    """Layers ``first_layer .. first_layer + layer_count - 1`` of one pipeline stage."""

    index: int
    first_layer: int
    layer_count: int
    planned_bytes: int = 0


@dataclass(frozen=True)
class PipelineJob:
    """Everything one stage process needs (picklable for spawn)."""

    source: str
    stages: tuple[StageSpec, ...]
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    dtype: str | None
    result_dir: str
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    nnodes: int = 1
    node_rank: int = 0
    pad_token_id: int = 0

    @property
    def world_size(self) -> int:
        return len(self.stages)

    @property
    def local_stages(self) -> int:
        return self.world_size // self.nnodes


@dataclass
class StageReport:
    """What one stage process measured (RSS in bytes, times in seconds)."""

    rank: int
    first_layer: int
    layer_count: int
    planned_bytes: int
    weights_bytes: int
    nbytes_read: int
    rss_before_load: int
    rss_after_load: int
    rss_peak: int
    load_s: float


@dataclass
class PipelineRunResult:
    """The generated tokens, the first forward's logits (last stage) and per-stage figures."""

    tokens: list[int]
    first_logits: torch.Tensor | None
    stages: list[StageReport] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        steps = max(len(self.tokens) - 1, 0)
        return steps / self.decode_s if self.decode_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "stages": [asdict(stage) for stage in self.stages],
        }


class DecoderStage(nn.Module):
    """Layers of a Llama-style causal LM for one pipeline stage; parameter names are the
    checkpoint's (``model.layers.7.mlp...``), so the loader matches them as they are."""

    def __init__(self, full: nn.Module, first: int, count: int, *, is_first: bool, is_last: bool):
        super().__init__()
        base = getattr(full, getattr(full, "base_model_prefix", "model"), None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if (
            base is None
            or not all(hasattr(base, name) for name in needed)
            or not hasattr(full, "lm_head")
        ):
            raise BadInputError(
                f"{type(full).__name__} is not a Llama-style causal LM (model.embed_tokens, "
                "model.layers, model.norm, model.rotary_emb, lm_head); the pipeline run "
                "supports those"
            )
        self.config = full.config
        self.is_first, self.is_last = is_first, is_last
        self.model = nn.Module()
        if is_first:
            self.model.embed_tokens = base.embed_tokens
        self.model.layers = nn.ModuleDict(
            {str(i): base.layers[i] for i in range(first, first + count)}
        )
        self.model.rotary_emb = base.rotary_emb
        if is_last:
            self.model.norm = base.norm
            self.lm_head = full.lm_head
            tied = full.lm_head.weight is getattr(base.embed_tokens, "weight", None)
            if tied and not is_first:
                self.model.embed_tokens = base.embed_tokens  # the checkpoint stores it there

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask  # noqa: PLC0415 (transformers is heavy)

        hidden = self.model.embed_tokens(x) if self.is_first else x  # (B, T, C)
        position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden,
            attention_mask=None,
            cache=None,
            position_ids=position_ids,
        )
        position_embeddings = self.model.rotary_emb(hidden, position_ids=position_ids)
        for layer in self.model.layers.values():
            hidden = layer(
                hidden,
                attention_mask=mask,
                position_embeddings=position_embeddings,
                position_ids=position_ids,
            )
        if not self.is_last:
            return hidden
        return self.lm_head(self.model.norm(hidden))  # (B, T, vocab)


def even_stages(num_layers: int, stages: int) -> tuple[StageSpec, ...]:
    """Split ``num_layers`` into ``stages`` contiguous runs differing by at most one layer
    (the earlier stages take the extra ones)."""
    if not 1 <= stages <= num_layers:
        raise BadInputError(
            f"--pipeline-stages must be 1..{num_layers} (the layer count), got {stages}"
        )
    base, extra = divmod(num_layers, stages)
    specs, first = [], 0
    for index in range(stages):
        count = base + (1 if index < extra else 0)
        specs.append(StageSpec(index, first, count))
        first += count
    return tuple(specs)


def planned_stages(
    opened: Any, stages: int, *, chunk_tokens: int, dtype: Any = None
) -> tuple[StageSpec, ...]:
    """The cluster planner's partition for ``stages`` CPU processes on this machine, each with
    the planned bytes (weights + activations + the torch process overhead) of its stage."""
    layout = ModelLayout.from_opened(opened)
    if not 1 <= stages <= layout.num_layers:
        raise BadInputError(
            f"--pipeline-stages must be 1..{layout.num_layers} (the layer count), got {stages}"
        )
    ram = psutil.virtual_memory().total
    cluster = cluster_from_dict(
        {
            "name": "local-processes",
            "network": {"bandwidth_gbits": 80.0, "latency_us": 20.0},  # loopback TCP
            "nodes": [
                {
                    "name": "process",
                    "count": stages,
                    "intra_link": {"kind": "pcie", "bandwidth_gbps": 10.0},
                    "gpus": [
                        {
                            "name": "CPU process",
                            "memory": ram // stages,
                            "compute_tflops": 0.5,
                            "memory_bandwidth_gbps": 40.0,
                        }
                    ],
                }
            ],
        }
    )
    plan = plan_cluster(
        layout, cluster, engine="torch", context_tokens=chunk_tokens, chunk_tokens=chunk_tokens,
        tp_sizes=(1,),
    )  # fmt: skip
    candidate = next(c for c in plan.candidates if c.pp == stages)
    return tuple(
        StageSpec(s.index, s.first_layer, s.layer_count, s.total_bytes - s.kv_cache_bytes)
        for s in candidate.stages
    )


def free_port() -> int:
    """A free TCP port on loopback for the rendezvous."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


def _load_stage(job: PipelineJob, spec: StageSpec) -> tuple[DecoderStage, Any, float]:
    opened = open_model(job.source)
    if opened.folder is None or not opened.has_weights:
        raise BadInputError(
            f"{job.source} has no weights; the pipeline run needs a checkpoint folder"
        )
    last = job.world_size - 1
    module = DecoderStage(
        opened.model,
        spec.first_layer,
        spec.layer_count,
        is_first=spec.index == 0,
        is_last=spec.index == last,
    )
    start = time.perf_counter()
    # The other stages' tensors are skipped on purpose: drop the loader's "not used" log line
    # for this stage module (a *missing* tensor still warns).
    load_log = logging.getLogger("workbench.big_modeling.loading.plan")
    log_filter = _SkippedOnPurpose()
    load_log.addFilter(log_filter)
    try:
        loaded = load_checkpoint_in_model(
            module, opened.folder, device_map={"": "cpu"}, dtype=job.dtype
        )
    finally:
        load_log.removeFilter(log_filter)
    return module.eval(), loaded, time.perf_counter() - start


class _SkippedOnPurpose(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "were not used when initializing DecoderStage" not in message


def stage_main(local_rank: int, job: PipelineJob) -> None:
    """The body of one stage process (the spawn target)."""
    from torch.distributed.pipelining import (  # noqa: PLC0415 (seconds to import; stage processes only)
        PipelineStage,
        ScheduleGPipe,
    )

    rank = job.node_rank * job.local_stages + local_rank
    if job.master_addr in ("127.0.0.1", "localhost"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // job.local_stages))
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{job.master_addr}:{job.master_port}",
        rank=rank,
        world_size=job.world_size,
    )
    try:
        spec = job.stages[rank]
        rss_before = _rss()
        module, loaded, load_s = _load_stage(job, spec)
        rss_loaded = _rss()
        stage = PipelineStage(module, rank, job.world_size, torch.device("cpu"))
        schedule = ScheduleGPipe(stage, n_microbatches=1)
        prompt = len(job.prompt_ids)
        ids = torch.full((1, prompt + job.max_new_tokens), job.pad_token_id, dtype=torch.long)
        ids[0, :prompt] = torch.tensor(job.prompt_ids, dtype=torch.long)
        last = rank == job.world_size - 1
        tokens: list[int] = []
        step_s: list[float] = []
        with torch.no_grad():
            for step in range(job.max_new_tokens):
                position = prompt + step
                start = time.perf_counter()
                output = schedule.step(ids) if rank == 0 else schedule.step()
                chosen = torch.zeros(1, dtype=torch.long)
                if last:
                    if step == 0:
                        save_file(
                            {"logits": output[0, :prompt].contiguous()},
                            str(Path(job.result_dir) / LOGITS_NAME),
                        )
                    chosen[0] = output[0, position - 1].argmax()
                dist.broadcast(chosen, src=job.world_size - 1)
                step_s.append(time.perf_counter() - start)
                ids[0, position] = chosen[0]
                tokens.append(int(chosen[0]))
        report = StageReport(
            rank=rank,
            first_layer=spec.first_layer,
            layer_count=spec.layer_count,
            planned_bytes=spec.planned_bytes,
            weights_bytes=sum(t.numel() * t.element_size() for t in module.state_dict().values()),
            nbytes_read=loaded.nbytes_read,
            rss_before_load=rss_before,
            rss_after_load=rss_loaded,
            rss_peak=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            load_s=load_s,
        )
        document = {"report": asdict(report), "tokens": tokens, "step_s": step_s}
        target = Path(job.result_dir) / RESULT_NAME.format(rank=rank)
        target.write_text(json.dumps(document), encoding="utf-8")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    _leave_stage_process()


def _leave_stage_process() -> None:
    """End a stage process that finished its work without the interpreter's exit: its C++
    destructors abort now and then after a clean ``destroy_process_group`` ("terminate called
    without an active exception", a gloo thread still joinable; 1 run in 6 of a two-rank gloo
    test on a 2-core machine), which ``start_processes`` reports as a failed stage."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_pipeline(
    source: str,
    stages: tuple[StageSpec, ...],
    prompt_ids: list[int],
    *,
    max_new_tokens: int = 8,
    dtype: str | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
) -> PipelineRunResult | None:
    """Start this node's stage processes, wait for them, and collect what they measured.

    Returns:
        The result on the node holding the last stage (every node when ``nnodes == 1``);
        ``None`` on other nodes (their stages' reports stay on their machines).

    Raises:
        BadInputError: a stage count that does not divide over the nodes, no prompt, or
            ``max_new_tokens < 1``.
        torch.multiprocessing.ProcessRaisedException: a stage failed (its traceback).
    """
    if len(stages) % nnodes:
        raise BadInputError(f"{len(stages)} stages do not divide evenly over {nnodes} nodes")
    if not 0 <= node_rank < nnodes:
        raise BadInputError(f"--node-rank must be 0..{nnodes - 1}, got {node_rank}")
    if not prompt_ids or max_new_tokens < 1:
        raise BadInputError("the pipeline run needs a non-empty prompt and max_new_tokens >= 1")
    with tempfile.TemporaryDirectory(prefix="workbench-pipeline-") as result_dir:
        job = PipelineJob(
            source=source,
            stages=stages,
            prompt_ids=tuple(prompt_ids),
            max_new_tokens=max_new_tokens,
            dtype=dtype,
            result_dir=result_dir,
            master_addr=master_addr,
            master_port=master_port or (free_port() if nnodes == 1 else 29500),
            nnodes=nnodes,
            node_rank=node_rank,
        )
        mp.start_processes(stage_main, args=(job,), nprocs=job.local_stages, start_method="spawn")
        return _collect(Path(result_dir), job)


def _collect(result_dir: Path, job: PipelineJob) -> PipelineRunResult | None:
    logits_path = result_dir / LOGITS_NAME
    if not logits_path.is_file():
        return None
    reports, tokens, step_s = [], [], []
    for path in sorted(result_dir.glob("stage*.json")):
        document = read_json(path, what="a pipeline stage report", fix="Run the pipeline again.")
        reports.append(StageReport(**document["report"]))
        tokens, step_s = document["tokens"], document["step_s"]
    return PipelineRunResult(
        tokens=list(tokens),
        first_logits=load_file(str(logits_path))["logits"],
        stages=sorted(reports, key=lambda report: report.rank),
        prefill_s=step_s[0] if step_s else 0.0,
        decode_s=sum(step_s[1:]),
    )
