"""``workbench inspect``: text and JSON trees of demo checkpoints and bundled configs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.models.intake import open_model


def test_text_tree_of_a_demo_checkpoint(cli, demo_dir: Path) -> None:
    code, out, err = cli("inspect", str(demo_dir), "--depth", "3")
    assert code == 0, err
    opened = open_model(demo_dir)
    assert "LlamaForCausalLM (llama)" in out
    assert f"in {len(opened.tree)} modules" in out
    assert "no-split   LlamaDecoderLayer" in out
    assert "weights    " in out and "in 2 files (float16" in out
    layer_rows = [
        line for line in out.splitlines() if "LlamaDecoderLayer" in line and "[no-split]" in line
    ]
    assert len(layer_rows) == opened.config.num_hidden_layers
    assert not [line for line in out.splitlines() if "self_attn" in line]  # depth 3 stops above


def test_json_tree_matches_the_model(cli, demo_dir: Path) -> None:
    code, out, _ = cli("inspect", str(demo_dir), "--json", "--depth", "1", "--dtype", "float32")
    assert code == 0
    data = json.loads(out)
    opened = open_model(demo_dir, dtype="float32")
    assert data["params"] == opened.tree.root.param_count
    assert data["nbytes"] == opened.tree.root.nbytes
    assert data["planning_dtype"] == "float32" and data["declared_dtype"] == "float16"
    assert data["checkpoint"]["nbytes"] == opened.checkpoint.total_nbytes
    assert [child["name"] for child in data["tree"]["children"]] == ["model", "lm_head"]
    assert "children" not in data["tree"]["children"][0]


def test_bundled_name_and_list(cli) -> None:
    code, out, _ = cli("inspect", "gpt2", "--depth", "1")
    assert code == 0
    assert "124M" in out and "lm_head = transformer.wte.weight" not in out
    assert "tied       lm_head.weight = transformer.wte.weight" in out
    code, out, _ = cli("inspect", "--list")
    assert code == 0 and "llama-3.1-405b" in out


def test_bad_inputs_exit_2_with_the_reason(cli, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "lama"}')
    code, out, err = cli("inspect", str(tmp_path))
    assert code == 2 and out == ""
    assert "model_type 'lama' is unknown to transformers" in err and "llama" in err
    code, _, err = cli("inspect", str(tmp_path / "missing"))
    assert code == 2 and "not a file, folder or bundled config" in err
    code, _, err = cli("inspect", "gpt2", "--depth", "-1")
    assert code == 2 and "--depth must be 0 or more" in err
    code, _, err = cli("inspect")
    assert code == 2 and "needs a SOURCE" in err


def _tiny_llama(**overrides: object) -> dict:
    data = json.loads(
        (Path(__file__).parents[2] / "resources/configs/tiny-llama-demo.json").read_text()
    )
    data.update(overrides)
    return {key: value for key, value in data.items() if value is not None}


def test_model_sources_the_user_must_fix_exit_2(cli, tmp_path: Path) -> None:
    missing = tmp_path / "missing-fields"
    missing.mkdir()
    (missing / "config.json").write_text(
        json.dumps(_tiny_llama(intermediate_size=None, num_attention_heads=None))
    )
    code, out, err = cli("inspect", str(missing))
    assert (code, out) == (2, "")
    assert (
        f"error: {missing / 'config.json'} is missing required fields for llama: "
        "intermediate_size, num_attention_heads;" in err
    )

    no_config = tmp_path / "no-config"
    no_config.mkdir()
    (no_config / "model.safetensors").write_bytes(b"")
    code, out, err = cli("plan", str(no_config), "--max-memory", "cpu=1GiB")
    assert (code, out) == (2, "")
    assert f"folder {no_config} has no config.json (it holds: model.safetensors)" in err

    unbuildable = tmp_path / "unbuildable"
    unbuildable.mkdir()
    (unbuildable / "config.json").write_text(json.dumps(_tiny_llama(intermediate_size=-5)))
    code, out, err = cli("inspect", str(unbuildable), "--json")
    assert (code, out) == (2, "")
    # the structural fields are checked before transformers builds anything (issue 16)
    assert (
        f"error: {unbuildable / 'config.json'}: 'intermediate_size' must be a whole number of "
        "at least 1, got -5" in err
    )


@pytest.mark.slow  # a fresh interpreter imports torch and transformers
def test_a_runtime_failure_exits_1_and_leaves_nothing(tmp_path: Path) -> None:
    """A full disk is not the user's input: make-demo under a 256 KiB file-size limit fails
    writing its first shard, exits 1, and leaves no half-made folder."""
    import resource
    import signal

    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))

    result = subprocess.run(
        [sys.executable, "-m", "workbench", "make-demo", str(tmp_path / "demo"), "--params", "2M"],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit_file_size,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("failed: ") and "File too large" in result.stderr
    assert result.stdout == "" and list(tmp_path.iterdir()) == []


@pytest.mark.slow  # a fresh interpreter imports torch and transformers
def test_real_subprocess_json_and_exit_codes(tmp_path: Path) -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "workbench", "inspect", "tiny-llama-demo", "--json", "--depth", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    assert data["model_class"] == "LlamaForCausalLM" and data["tree"]["name"] == ""
    assert ok.stderr == ""  # no progress bar when stderr is not a terminal
