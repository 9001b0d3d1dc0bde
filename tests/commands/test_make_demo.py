"""``workbench make-demo``: writes a loadable folder; bad arguments exit 2."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from terminal import run_on_a_terminal

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


def test_the_library_reports_each_shard_within_the_writing_stage(tmp_path: Path) -> None:
    from workbench.big_modeling import CheckpointIndex
    from workbench.big_modeling.loading.writer import ShardProgress
    from workbench.models.demo import DEMO_STAGES, make_demo

    events: list[str | ShardProgress] = []
    folder = make_demo(
        tmp_path / "d",
        params="500K",
        shards=3,
        progress=events.append,
        shard_progress=events.append,
    )
    files = sorted(path.name for path in folder.glob("*.safetensors"))
    assert len(files) == 3
    shards = events[3:-1]
    assert events[:3] == list(DEMO_STAGES[:3]) and events[-1] == DEMO_STAGES[3]
    assert [(r.shards_done, r.num_shards, r.file_name) for r in shards] == [
        (0, 3, ""),
        *[(k, 3, name) for k, name in enumerate(files, start=1)],
    ]
    stored_nbytes = CheckpointIndex.from_path(folder).total_nbytes  # read from the headers
    assert [r.bytes_total for r in shards] == [stored_nbytes] * 4
    assert shards[-1].bytes_done == stored_nbytes
    assert [r.bytes_done for r in shards] == sorted({r.bytes_done for r in shards})


@pytest.mark.slow  # a subprocess that imports torch and transformers
def test_a_terminal_sees_each_shard_being_written_in_order(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    argv = [sys.executable, "-m", "workbench", "make-demo", str(folder)]
    code, out, terminal = run_on_a_terminal([*argv, "--params", "1M", "--shards", "3"], 240)
    assert code == 0, terminal
    assert "in 3 shard(s)" in out
    # tqdm redraws the line as "making llama demo: STAGE:  40%|####  | 2/5 [...]"
    shown = re.findall(r"making llama demo: ([^\r\n:|]+):\s+\d+%", terminal)
    steps = [text for k, text in enumerate(shown) if k == 0 or shown[k - 1] != text]
    assert steps == [
        "writing tokenizer",
        "making random weights",
        "writing shards",
        "writing shard 1 of 3",
        "writing shard 2 of 3",
        "writing shard 3 of 3",
        "wrote 3 shards",
        "writing config",
        "opening the demo",
    ], terminal
