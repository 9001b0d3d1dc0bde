"""Engine launch templates, pinned: vLLM over Ray, SGLang per node, llama.cpp RPC; and the
exported folder (one executable script per node and a README)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from workbench.big_modeling.errors import BadInputError
from workbench.models.cluster import cluster_from_dict, load_cluster
from workbench.runtime.cluster_layout import ModelLayout
from workbench.runtime.cluster_plan import plan_cluster
from workbench.runtime.engine_export import (
    export_launch_scripts,
    llama_cpp_server_args,
    node_scripts,
    sglang_launch_args,
    vllm_serve_args,
)

GIB = 2**30
HEAD = "${HEAD_IP:?set HEAD_IP to the address of node 0}"


def _layout() -> ModelLayout:
    # 32 layers of 2 GiB, 1 GiB embeddings, 1 GiB head: 66 GiB of bf16 weights
    return ModelLayout(
        name="toy-66g",
        layer_names=tuple(f"model.layers.{i}" for i in range(32)),
        layer_nbytes=(2 * GIB,) * 32,
        layer_params=(GIB,) * 32,
        pre_names=("model.embed_tokens",),
        pre_nbytes=GIB,
        pre_params=GIB // 2,
        post_names=("model.norm", "lm_head"),
        post_nbytes=GIB,
        post_params=GIB // 2,
        hidden_size=8192,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        vocab_size=128256,
        max_positions=8192,
        weight_dtype=torch.bfloat16,
    )


@pytest.fixture(scope="module")
def h100_plan():
    return plan_cluster(
        _layout(), load_cluster("2x8-h100-80gb"), engine="vllm", context_tokens=8192
    )


def test_vllm_serve_line_carries_tp_pp_memory_and_context(h100_plan):
    best = h100_plan.best
    assert best is not None and best.tp == 8 and best.pp == 1  # 66 GiB / 8 fits one node
    args = vllm_serve_args(h100_plan, best, "org/toy")
    utilization = args[args.index("--gpu-memory-utilization") + 1]
    stage = best.stages[0]
    # the plan's per-GPU need over 80 GiB, rounded up to 0.01
    assert float(utilization) * 80 * GIB >= stage.total_bytes
    assert (float(utilization) - 0.01) * 80 * GIB < stage.total_bytes
    assert args == [
        "vllm", "serve", "org/toy",
        "--tensor-parallel-size", "8",
        "--pipeline-parallel-size", "1",
        "--gpu-memory-utilization", utilization,
        "--max-model-len", "8192",
        "--max-num-seqs", "1",
        "--max-num-batched-tokens", "2048",
        "--kv-cache-dtype", "auto",
    ]  # fmt: skip
    (script,) = node_scripts(h100_plan, best, "org/toy")
    assert "ray start" not in script.text  # one node: no Ray cluster needed


def test_vllm_two_nodes_start_ray_and_pin_the_layer_partition(h100_plan):
    candidate = next(c for c in h100_plan.candidates if c.label == "TP8 x PP2")
    head, worker = node_scripts(h100_plan, candidate, "org/toy")
    partition = ",".join(map(str, candidate.layer_partition))
    assert head.text.splitlines()[4:8] == [
        "export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7",
        "ray start --head --port=6379",
        "# wait until `ray status` shows 16 GPUs",
        f"export VLLM_PP_LAYER_PARTITION={partition}",
    ]
    assert "  --pipeline-parallel-size 2 \\\n" in head.text
    assert head.text.endswith("  --distributed-executor-backend ray\n")
    assert worker.text.endswith(f'ray start \\\n  "--address={HEAD}:6379" \\\n  --block\n')
    assert f"export VLLM_PP_LAYER_PARTITION={partition}\n" in worker.text


def test_sglang_lines_per_node(h100_plan):
    plan = plan_cluster(
        _layout(), load_cluster("2x8-h100-80gb"), engine="sglang", context_tokens=8192
    )
    candidate = next(c for c in plan.candidates if c.label == "TP8 x PP2")
    stage = candidate.stages[0]
    line = sglang_launch_args(plan, candidate, "org/toy", 0)
    fraction = line[line.index("--mem-fraction-static") + 1]
    assert float(fraction) * 80 * GIB >= stage.weights_bytes + stage.kv_cache_bytes
    common = [
        "python3", "-m", "sglang.launch_server",
        "--model-path", "org/toy",
        "--tp", "8",
        "--pp-size", "2",
        "--mem-fraction-static", fraction,
        "--context-length", "8192",
        "--chunked-prefill-size", "2048",
        "--max-running-requests", "1",
        "--kv-cache-dtype", "auto",
        "--nnodes", "2",
    ]  # fmt: skip
    assert sglang_launch_args(plan, candidate, "org/toy", 0) == [
        *common, "--node-rank", "0", "--dist-init-addr", f"{HEAD}:20000",
        "--host", "0.0.0.0", "--port", "30000",
    ]  # fmt: skip
    assert sglang_launch_args(plan, candidate, "org/toy", 1) == [
        *common, "--node-rank", "1", "--dist-init-addr", f"{HEAD}:20000",
    ]  # fmt: skip


def test_llama_cpp_rpc_split_follows_the_layer_partition():
    cluster = load_cluster("4x1-rtx4090-10gbe")
    layout = _layout()
    plan = plan_cluster(layout, cluster, engine="llama.cpp", context_tokens=4096)
    best = plan.best
    assert best is not None and best.tp == 1 and best.pp == 4
    main, *workers = node_scripts(plan, best, "toy-66g")
    assert llama_cpp_server_args(plan, best, "toy-66g.gguf", ["${NODE1_IP}"]) == [
        "llama-server", "-m", "toy-66g.gguf", "-ngl", "99", "-c", "4096",
        "--tensor-split", ",".join(map(str, best.layer_partition)),
        "--rpc", "${NODE1_IP}:50052",
    ]  # fmt: skip
    assert '"${NODE1_IP}:50052,${NODE2_IP}:50052,${NODE3_IP}:50052"' in main.text
    assert len(workers) == 3
    assert all(w.text.endswith("rpc-server \\\n  -H 0.0.0.0 \\\n  -p 50052\n") for w in workers)
    with pytest.raises(BadInputError, match="layers only"):
        tp_plan = plan_cluster(layout, load_cluster("2x8-h100-80gb"), context_tokens=4096)
        llama_cpp_server_args(tp_plan, tp_plan.best, "x.gguf", [])


def test_export_writes_one_executable_script_per_node_and_a_readme(h100_plan, tmp_path: Path):
    candidate = next(c for c in h100_plan.candidates if c.label == "TP8 x PP2")
    written = export_launch_scripts(
        h100_plan, tmp_path / "launch", candidate=candidate, model_ref="org/toy"
    )
    names = sorted(path.name for path in written)
    assert names == ["README.md", "node0-h100-node0.sh", "node1-h100-node1.sh"]
    for path in written:
        if path.suffix == ".sh":
            assert os.access(path, os.X_OK)
            assert path.read_text().startswith("#!/usr/bin/env bash\n")
    readme = (tmp_path / "launch" / "README.md").read_text()
    assert "## Chosen: TP8 x PP2 (fits)" in readme
    assert "| TP4 x PP4 |" in readme  # the alternatives, side by side
    assert not list((tmp_path / "launch").glob(".*.tmp"))  # atomic writes left nothing behind


def test_nothing_to_export_when_nothing_fits(tmp_path: Path):
    tiny = cluster_from_dict({"name": "tiny", "nodes": [{"gpus": [{"memory": "4GiB"}]}]})
    plan = plan_cluster(_layout(), tiny, engine="vllm", context_tokens=1024)
    with pytest.raises(BadInputError, match="no candidate fits toy-66g on tiny"):
        export_launch_scripts(plan, tmp_path / "out")
