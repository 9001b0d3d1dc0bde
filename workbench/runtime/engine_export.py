"""Turn a cluster plan into the launch lines of the engines people serve with.

One script per node and a README of the plan. The flags are the ones each engine documents:

- vLLM, multi-node serving over Ray, https://docs.vllm.ai/en/latest/serving/parallelism_scaling.html
  (``ray start --head`` / ``ray start --address=HEAD:6379``, then ``vllm serve`` on the head
  with ``--tensor-parallel-size`` = GPUs per stage and ``--pipeline-parallel-size`` = stages);
  engine arguments (``--gpu-memory-utilization``, ``--max-model-len``, ``--kv-cache-dtype``,
  ``--max-num-batched-tokens``, ``--max-num-seqs``, ``--distributed-executor-backend``):
  https://docs.vllm.ai/en/latest/configuration/engine_args.html; ``VLLM_PP_LAYER_PARTITION``
  (comma-separated layers per stage): https://docs.vllm.ai/en/latest/configuration/env_vars.html
- SGLang, https://docs.sglang.io/references/multi_node_deployment/multi_node.html
  (``python3 -m sglang.launch_server --tp --nnodes --node-rank --dist-init-addr``) and
  https://docs.sglang.io/advanced_features/server_arguments.html (``--pp-size``,
  ``--mem-fraction-static``, ``--context-length``, ``--chunked-prefill-size``,
  ``--kv-cache-dtype``, ``--max-running-requests``).
- llama.cpp RPC, https://github.com/ggml-org/llama.cpp/blob/master/tools/rpc/README.md
  (``rpc-server -H 0.0.0.0 -p 50052`` on each remote host; ``llama-server -m MODEL.gguf -ngl 99
  --rpc HOST:PORT,... --tensor-split ...`` on the main host) and
  https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md (``-c``).
"""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from workbench.big_modeling.atomic import atomic_write_text
from workbench.big_modeling.errors import BadInputError
from workbench.runtime.cluster_plan import GIB, ClusterCandidate, ClusterPlan
from workbench.runtime.formatting import format_rate, format_seconds

HEAD_ADDR = "${HEAD_IP:?set HEAD_IP to the address of node 0}"
RAY_PORT = 6379
SGLANG_DIST_PORT = 20000
RPC_PORT = 50052


@dataclass(frozen=True)
class NodeScript:
    """The launch script of one node: file name, node index in the cluster, its text."""

    filename: str
    node: int
    text: str


def _nodes_of(candidate: ClusterCandidate) -> list[int]:
    return sorted({stage.node for stage in candidate.stages})


def _gpus_on(candidate: ClusterCandidate, node: int) -> list[int]:
    return sorted({gpu for stage in candidate.stages if stage.node == node for gpu in stage.gpus})


def _fraction(nbytes: int, total: int) -> float:
    """``nbytes / total`` rounded up to 0.01 (what the engines' fraction flags take)."""
    return math.ceil(100 * nbytes / total) / 100


def vllm_serve_args(plan: ClusterPlan, candidate: ClusterCandidate, model_ref: str) -> list[str]:
    """The ``vllm serve`` argv for the head node.

    ``--gpu-memory-utilization`` is the largest per-GPU need of the plan (weights + KV cache +
    activations + overhead) over that GPU's memory, rounded up to 0.01.
    """
    utilization = max(_fraction(s.total_bytes, s.memory_bytes) for s in candidate.stages)
    args = [
        "vllm", "serve", model_ref,
        "--tensor-parallel-size", str(candidate.tp),
        "--pipeline-parallel-size", str(candidate.pp),
        "--gpu-memory-utilization", f"{utilization:.2f}",
        "--max-model-len", str(plan.context_tokens),
        "--max-num-seqs", str(plan.batch_size),
        "--max-num-batched-tokens", str(plan.chunk_tokens),
        "--kv-cache-dtype", plan.kv_cache_dtype,
    ]  # fmt: skip
    if len(_nodes_of(candidate)) > 1:
        args += ["--distributed-executor-backend", "ray"]
    return args


def sglang_launch_args(
    plan: ClusterPlan, candidate: ClusterCandidate, model_ref: str, node_rank: int
) -> list[str]:
    """The ``sglang.launch_server`` argv of one node (``node_rank`` counts the nodes used).

    ``--mem-fraction-static`` covers what SGLang allocates statically (weights and the KV
    pool), rounded up to 0.01 over the GPU's memory.
    """
    fraction = max(
        _fraction(s.weights_bytes + s.kv_cache_bytes, s.memory_bytes) for s in candidate.stages
    )
    nodes = _nodes_of(candidate)
    args = [
        "python3", "-m", "sglang.launch_server",
        "--model-path", model_ref,
        "--tp", str(candidate.tp),
        "--pp-size", str(candidate.pp),
        "--mem-fraction-static", f"{fraction:.2f}",
        "--context-length", str(plan.context_tokens),
        "--chunked-prefill-size", str(plan.chunk_tokens),
        "--max-running-requests", str(plan.batch_size),
        "--kv-cache-dtype", plan.kv_cache_dtype,
    ]  # fmt: skip
    if len(nodes) > 1:
        args += [
            "--nnodes", str(len(nodes)),
            "--node-rank", str(node_rank),
            "--dist-init-addr", f"{HEAD_ADDR}:{SGLANG_DIST_PORT}",
        ]  # fmt: skip
    if node_rank == 0:
        args += ["--host", "0.0.0.0", "--port", "30000"]
    return args


def llama_cpp_server_args(
    plan: ClusterPlan, candidate: ClusterCandidate, gguf_path: str, rpc_hosts: list[str]
) -> list[str]:
    """The ``llama-server`` argv of the main host: every layer on a GPU (``-ngl 99``), the
    plan's layer counts as ``--tensor-split`` (local GPUs first, then the RPC servers)."""
    if candidate.tp != 1:
        raise BadInputError(f"llama.cpp splits by layers only; {candidate.label} has TP > 1")
    args = ["llama-server", "-m", gguf_path, "-ngl", "99", "-c", str(plan.context_tokens)]
    args += ["--tensor-split", ",".join(str(c) for c in candidate.layer_partition)]
    if rpc_hosts:
        args += ["--rpc", ",".join(f"{host}:{RPC_PORT}" for host in rpc_hosts)]
    return args


def _quote(arg: str) -> str:
    return f'"{arg}"' if "${" in arg else shlex.quote(arg)


def _join(args: list[str]) -> str:
    """Shell-quote ``args`` (leaving ``${...}`` expansions to the shell), one option and its
    value per line."""
    lines: list[str] = []
    for arg in args:
        previous = lines[-1] if lines else None
        lone_flag = previous is not None and previous.startswith("-") and " " not in previous
        command_words = previous is not None and not previous.startswith("-")
        if not arg.startswith("-") and (lone_flag or command_words):
            lines[-1] += " " + _quote(arg)
        else:
            lines.append(_quote(arg))
    return " \\\n  ".join(lines)


def _header(plan: ClusterPlan, candidate: ClusterCandidate, node: int, role: str) -> str:
    name = plan.cluster.nodes[node].name
    gpus = ",".join(map(str, _gpus_on(candidate, node)))
    return (
        "#!/usr/bin/env bash\n"
        f"# {plan.engine}: {plan.model} on {plan.cluster.name}, {candidate.label}; "
        f"node {node} ({name}), {role}.\n"
        "# Written by `workbench cluster-plan`; see README.md beside this file.\n"
        "set -euo pipefail\n"
        f"export CUDA_VISIBLE_DEVICES={gpus}\n"
    )


def node_scripts(
    plan: ClusterPlan,
    candidate: ClusterCandidate | None = None,
    model_ref: str | None = None,
) -> list[NodeScript]:
    """One launch script per node the candidate uses (default: the plan's best).

    Raises:
        BadInputError: when nothing fits and no candidate is given.
    """
    chosen = candidate or plan.best
    if chosen is None:
        raise BadInputError(
            f"no candidate fits {plan.model} on {plan.cluster.name}; nothing to export"
        )
    ref = model_ref or plan.model
    nodes = _nodes_of(chosen)
    scripts = []
    for rank, node in enumerate(nodes):
        name = f"node{rank}-{plan.cluster.nodes[node].name}.sh"
        if plan.engine == "vllm":
            if rank == 0:
                body = ""
                if len(nodes) > 1:
                    body += f"ray start --head --port={RAY_PORT}\n"
                    body += f"# wait until `ray status` shows {chosen.gpus_used} GPUs\n"
                if chosen.pp > 1:
                    partition = ",".join(str(c) for c in chosen.layer_partition)
                    body += f"export VLLM_PP_LAYER_PARTITION={partition}\n"
                body += _join(vllm_serve_args(plan, chosen, ref)) + "\n"
                text = _header(plan, chosen, node, "Ray head, runs vllm serve") + body
            else:
                partition_env = (
                    f"export VLLM_PP_LAYER_PARTITION={','.join(map(str, chosen.layer_partition))}\n"
                    if chosen.pp > 1
                    else ""
                )
                text = (
                    _header(plan, chosen, node, "Ray worker")
                    + partition_env
                    + (
                        _join(["ray", "start", f"--address={HEAD_ADDR}:{RAY_PORT}", "--block"])
                        + "\n"
                    )
                )
        elif plan.engine == "sglang":
            role = "rank 0, serves HTTP on :30000" if rank == 0 else f"rank {rank}"
            text = (
                _header(plan, chosen, node, role)
                + _join(sglang_launch_args(plan, chosen, ref, rank))
                + "\n"
            )
        elif plan.engine == "llama.cpp":
            if rank == 0:
                rpc_hosts = [f"${{NODE{r}_IP}}" for r in range(1, len(nodes))]
                gguf = ref if ref.endswith(".gguf") else f"{ref.rsplit('/', 1)[-1]}.gguf"
                text = (
                    _header(plan, chosen, node, "main host, runs llama-server")
                    + _join(llama_cpp_server_args(plan, chosen, gguf, rpc_hosts))
                    + "\n"
                )
            else:
                text = (
                    _header(plan, chosen, node, "RPC server")
                    + _join(["rpc-server", "-H", "0.0.0.0", "-p", str(RPC_PORT)])
                    + "\n"
                )
        else:
            text = _header(plan, chosen, node, "torch.distributed pipeline stage") + _join(
                [
                    "workbench", "run", ref, "--pipeline-stages", str(chosen.pp),
                    "--nnodes", str(len(nodes)), "--node-rank", str(rank),
                    "--master-addr", HEAD_ADDR,
                ]
            ) + "\n"  # fmt: skip
        scripts.append(NodeScript(name, node, text))
    return scripts


def plan_readme(plan: ClusterPlan, candidate: ClusterCandidate | None = None) -> str:
    """A Markdown summary of the plan: the chosen candidate's stages, the alternatives, the
    trace, and how to start the scripts."""
    chosen = candidate or plan.best
    lines = [
        f"# {plan.model} on {plan.cluster.name} with {plan.engine}",
        "",
        f"Context {plan.context_tokens} tokens, batch {plan.batch_size}, weights "
        f"{plan.weight_dtype}, KV cache {plan.kv_cache_dtype}, prefill chunk {plan.chunk_tokens}.",
        "",
    ]
    if chosen is not None:
        lines += [
            f"## Chosen: {chosen.label} ({'fits' if chosen.fits else 'DOES NOT FIT'})",
            "",
            f"Predicted decode {format_rate(chosen.decode_tokens_per_s)} (one batch), "
            f"{format_rate(chosen.pipelined_tokens_per_s)} with {chosen.pp} batches in flight; "
            f"prefill {format_rate(chosen.prefill_tokens_per_s)}; "
            f"TTFT {format_seconds(chosen.ttft_s)}.",
            "",
            "| stage | node | GPUs | layers | weights | KV cache | activations | overhead | total / budget (GiB, per GPU) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for s in chosen.stages:
            last = s.first_layer + s.layer_count - 1
            lines.append(
                f"| {s.index} | {s.node_name} | {','.join(map(str, s.gpus))} | "
                f"{s.first_layer}-{last} ({s.layer_count}) | {s.weights_bytes / GIB:.2f} | "
                f"{s.kv_cache_bytes / GIB:.2f} | {s.activation_bytes / GIB:.2f} | "
                f"{s.overhead_bytes / GIB:.2f} | {s.total_bytes / GIB:.2f} / {s.budget_bytes / GIB:.2f} |"
            )
        lines += ["", *[f"- {line}" for line in chosen.trace], ""]
    lines += [
        "## Candidates",
        "",
        "| candidate | GPUs | fits | decode | pipelined | prefill | layers per stage |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in plan.candidates:
        lines.append(
            f"| {c.label} | {c.gpus_used} | {'yes' if c.fits else 'no'} | "
            f"{format_rate(c.decode_tokens_per_s)} | {format_rate(c.pipelined_tokens_per_s)} | "
            f"{format_rate(c.prefill_tokens_per_s)} | {','.join(map(str, c.layer_partition))} |"
        )
    lines += ["", "## Why", "", *[f"- {line}" for line in plan.trace], "", "## Start", ""]
    lines.append(
        "Set `HEAD_IP` to node 0's address on every node (llama.cpp: `NODE1_IP`, ... on the main "
        "host), start the workers' scripts, then node 0's."
    )
    if plan.engine == "sglang" and chosen is not None and len(set(chosen.layer_partition)) > 1:
        lines.append(
            "SGLang splits layers evenly across `--pp-size` stages; the planned partition "
            f"({','.join(map(str, chosen.layer_partition))}) is what the memory figures assume."
        )
    if plan.engine == "llama.cpp":
        lines.append(
            "`--tensor-split` lists local GPUs first, then the RPC servers: compare with the "
            "device order `llama-server --list-devices` prints and reorder if it differs."
        )
    return "\n".join(lines) + "\n"


def export_launch_scripts(
    plan: ClusterPlan,
    folder: str | os.PathLike[str],
    *,
    candidate: ClusterCandidate | None = None,
    model_ref: str | None = None,
) -> list[Path]:
    """Write one executable script per node and ``README.md`` into ``folder`` (created),
    each file atomically. Returns the paths written."""
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for script in node_scripts(plan, candidate, model_ref):
        path = target / script.filename
        atomic_write_text(path, script.text)
        path.chmod(0o755)
        written.append(path)
    readme = target / "README.md"
    atomic_write_text(readme, plan_readme(plan, candidate))
    written.append(readme)
    return written
