"""``workbench cluster-plan``: the candidates table, the launch lines, --json and --export."""

from __future__ import annotations

import json
from pathlib import Path


def test_cluster_plan_prints_candidates_and_the_vllm_command(cli):
    code, out, _ = cli(
        "cluster-plan", "llama-3.1-8b", "--cluster", "4x1-rtx4090-10gbe", "--context", "8192"
    )
    assert code == 0
    assert "TP1 x PP1" in out  # 16 GB of bf16 weights do not fit one 24 GB card with KV...
    assert "vllm serve meta-llama/Llama-3.1-8B" in out
    assert "--max-model-len 8192" in out


def test_cluster_plan_json_and_export(cli, tmp_path: Path):
    code, out, _ = cli(
        "cluster-plan", "llama-3.1-70b", "--cluster", "2x8-h100-80gb", "--engine", "sglang",
        "--context", "32768", "--json", "--export", str(tmp_path / "launch"),
    )  # fmt: skip
    assert code == 0
    document = json.loads(out)
    assert document["engine"] == "sglang"
    assert document["best"] == document["candidates"][0]["label"]
    assert document["candidates"][0]["fits"]
    stages = document["candidates"][0]["stages"]
    assert sum(stage["layer_count"] for stage in stages) == 80
    exported = sorted(Path(path).name for path in document["exported"])
    assert "README.md" in exported
    assert all("sglang.launch_server" in text for text in document["scripts"].values())


def test_cluster_plan_exits_1_when_nothing_fits(cli):
    code, out, _ = cli(
        "cluster-plan",
        "llama-3.1-405b",
        "--cluster",
        "4x1-rtx4090-10gbe",
        "--engine",
        "llama.cpp",
        "--context",
        "4096",
    )
    assert code == 1
    assert "no candidate fits" in out


def test_unknown_cluster_is_bad_input(cli):
    code, _, err = cli("cluster-plan", "gpt2", "--cluster", "nope")
    assert code == 2
    assert "unknown cluster profile 'nope'" in err
