"""``workbench make-demo``: writes a loadable folder; bad arguments exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


def test_too_many_shards_are_capped_with_a_warning(cli, tmp_path: Path) -> None:
    folder = tmp_path / "capped"
    code, out, err = cli("make-demo", str(folder), "--params", "500K", "--shards", "200")
    assert code == 0, err
    written = len(list(folder.glob("*.safetensors")))
    assert 1 < written < 200
    assert err == (
        f"warning: asked for 200 shards, but this llama demo ({len(open_model(folder).checkpoint)} "
        f"tensors) splits into only {written} files of roughly equal size; wrote {written}\n"
    )
    assert f"in {written} shard(s)" in out


def test_the_library_warns_and_reports_its_stages(tmp_path: Path) -> None:
    from workbench.models.demo import DEMO_STAGES, make_demo

    stages: list[str] = []
    with pytest.warns(UserWarning, match=r"asked for 64 shards, .* wrote \d+$"):
        make_demo(tmp_path / "d", params="500K", shards=64, progress=stages.append)
    assert stages == list(DEMO_STAGES)
    stages.clear()
    make_demo(tmp_path / "e", params="500K", shards=2, progress=stages.append)  # no warning
    assert stages == list(DEMO_STAGES)
