"""``workbench plan``: cpu+disk maps on demo checkpoints, what-if GPUs, code export, bad input."""

from __future__ import annotations

import json
from pathlib import Path

from workbench.big_modeling.device_map import load_device_map
from workbench.models.intake import open_model


def _layer_nbytes(demo_dir: Path) -> int:
    return open_model(demo_dir).tree.node("model.layers.0").nbytes


def test_cpu_and_disk_map_written_and_valid(cli, demo_dir: Path, tmp_path: Path) -> None:
    layer = _layer_nbytes(demo_dir)
    out_path = tmp_path / "map.json"
    # room on the cpu for about two decoder layers; the rest goes to disk
    code, out, err = cli(
        "plan",
        str(demo_dir),
        "--max-memory",
        f"cpu={int(2.5 * layer)}",
        "disk=1GiB",
        "-o",
        str(out_path),
    )
    assert code == 0, err
    device_map = load_device_map(out_path, model=open_model(demo_dir).model)
    assert set(device_map.values()) == {"cpu", "disk"}
    assert device_map["lm_head"] == "disk"
    assert "cpu " in out and "disk " in out and f"wrote      {out_path}" in out
    assert "predicted " in out and "tok/s" in out and "disk-bound" not in out.split("predicted")[0]


def test_json_totals_add_up(cli, demo_dir: Path) -> None:
    layer = _layer_nbytes(demo_dir)
    code, out, _ = cli("plan", str(demo_dir), "--max-memory", f"cpu={int(2.5 * layer)}", "--json")
    assert code == 0
    data = json.loads(out)
    opened = open_model(demo_dir)
    assert sum(data["per_device_bytes"].values()) == opened.tree.root.nbytes
    assert data["per_device_bytes"]["cpu"] <= 2.5 * layer
    assert data["speed"]["tokens_per_s"] > 0
    assert data["speed"]["per_layer"][0]["name"] == "model.embed_tokens"


def test_what_if_profile_plans_gpus_this_machine_lacks(cli) -> None:
    code, out, err = cli(
        "plan", "llama-3.1-8b", "--profile", "2x-h100-80gb", "--strategy", "balanced", "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert set(data["device_map"].values()) == {0, 1}  # both what-if GPUs used, nothing offloaded
    assert data["profile"] == "2x-h100-80gb" and data["dtype"] == "bfloat16"
    # 8.03e9 params * 2 B over 2 GPUs, each a few GiB
    assert abs(data["per_device_bytes"]["0"] - data["per_device_bytes"]["1"]) < 2 * 2**30
    assert data["speed"]["bottleneck"] == "compute"


def test_override_profile_budget_and_emit_code(cli) -> None:
    code, out, err = cli(
        "plan",
        "llama-3.1-8b",
        "--profile",
        "rtx4090-64gb",
        "--max-memory",
        "0=8GiB",
        "--reserve",
        "0=1GiB",
        "--emit-code",
    )
    assert code == 0, err
    assert "cuda:0" in out and "/ 8 GiB" in out and "reserve 1 GiB" in out
    code_text = out[out.index("import torch") :]
    compile(code_text, "<emitted>", "exec")  # valid Python
    assert "LlamaForCausalLM.from_pretrained(" in code_text
    assert "'meta-llama/Llama-3.1-8B'" in code_text
    assert "max_memory={0: '8GiB', 'cpu': '64GiB', 'disk': '2TB'}" in code_text
    assert "dtype=torch.bfloat16" in code_text and "'model.layers.0': 0," in code_text


def test_auto_reserve_comes_from_the_config(cli) -> None:
    from workbench.big_modeling.reserve import estimate_activation_reserve

    code, out, err = cli(
        "plan",
        "llama-3.1-8b",
        "--profile",
        "rtx4090-64gb",
        "--reserve",
        "auto",
        "--prompt-tokens",
        "512",
        "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    expected = estimate_activation_reserve(open_model("llama-3.1-8b").config, 1, 512, "bfloat16")
    assert data["reserve"] == {"0": expected}
    assert data["per_device_bytes"]["0"] <= 24 * 2**30 - expected


def test_bad_inputs_exit_2(cli, demo_dir: Path) -> None:
    cases = [
        (["--max-memory", "cpu64GiB"], "must look like DEVICE=SIZE"),
        (["--max-memory", "cpu=lots"], "'lots' is not a memory size"),
        (["--max-memory", "gpu0=1GiB"], "'gpu0' is not a device"),
        (["--max-memory", "cpu=1GiB", "cpu=2GiB"], "gives device 'cpu' twice"),
        (["--profile", "rtx5090"], "unknown hardware profile 'rtx5090'"),
        (["--max-memory", "cpu=1KiB", "disk=1KiB"], "disk"),
        (
            ["--max-memory", "cpu=1GiB", "--reserve", "0=1GiB"],
            "reserve names devices without a budget: 0",
        ),
    ]
    for extra, message in cases:
        code, out, err = cli("plan", str(demo_dir), *extra)
        assert code == 2, (extra, err)
        assert message in err, (extra, err)
        assert out == ""
