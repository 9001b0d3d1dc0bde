"""``workbench make-demo``: writes a loadable folder; bad arguments exit 2."""

from __future__ import annotations

import json
from pathlib import Path

from workbench.models.intake import open_model


def test_makes_a_gpt2_demo(cli, tmp_path: Path) -> None:
    folder = tmp_path / "gpt2-demo"
    code, out, err = cli(
        "make-demo",
        str(folder),
        "--arch",
        "gpt2",
        "--params",
        "1M",
        "--shards",
        "2",
        "--dtype",
        "bfloat16",
        "--seed",
        "3",
    )
    assert code == 0, err
    assert f"wrote GPT2LMHeadModel demo to {folder}" in out
    opened = open_model(folder)
    assert str(opened.declared_dtype) == "torch.bfloat16"
    assert len(opened.checkpoint.files) == 2
    assert 0.8e6 < opened.tree.root.param_count < 1.2e6


def test_json_output(cli, tmp_path: Path) -> None:
    code, out, _ = cli(
        "make-demo", str(tmp_path / "d"), "--params", "500K", "--shards", "1", "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert data["shards"] == 1 and "model.safetensors" in data["files"]
    assert data["model_class"] == "LlamaForCausalLM"


def test_bad_arguments_exit_2(cli, tmp_path: Path, demo_dir: Path) -> None:
    code, _, err = cli("make-demo", str(tmp_path / "a"), "--params", "huge")
    assert code == 2 and "--params 'huge' is not a parameter count" in err
    code, _, err = cli("make-demo", str(tmp_path / "b"), "--arch", "t5")
    assert code == 2 and "unknown demo arch 't5'" in err
    code, _, err = cli("make-demo", str(demo_dir))
    assert code == 2 and "already exists and is not empty" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
