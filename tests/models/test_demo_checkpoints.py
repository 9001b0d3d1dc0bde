"""Demo checkpoints: deterministic bytes, HF-loadable, generation end to end, cached demo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench.models.demo import choose_shape, demo_model_dir, make_demo, parse_count
from workbench.models.errors import ModelSourceError


def _file_bytes(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_same_seed_same_bytes_other_seed_other_weights(
    tmp_path: Path, demo_llama_dir: Path
) -> None:
    again = make_demo(tmp_path / "again", arch="llama", params="2M", shards=3)
    assert _file_bytes(again) == _file_bytes(demo_llama_dir)
    other = make_demo(tmp_path / "other", arch="llama", params="2M", shards=3, seed=1)
    first, second = _file_bytes(demo_llama_dir), _file_bytes(other)
    assert first["config.json"] == second["config.json"]
    assert first["tokenizer.json"] == second["tokenizer.json"]
    assert first["model-00001-of-00003.safetensors"] != second["model-00001-of-00003.safetensors"]


def test_folder_layout_and_index(demo_llama_dir: Path) -> None:
    names = sorted(path.name for path in demo_llama_dir.iterdir())
    assert names == [
        "config.json",
        "generation_config.json",
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    index = json.loads((demo_llama_dir / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {n for n in names if n.endswith(".safetensors")}
    config = json.loads((demo_llama_dir / "config.json").read_text())
    assert config["dtype"] == "float16" and config["model_type"] == "llama"
    assert not any(p.name.startswith(".") for p in demo_llama_dir.parent.iterdir())  # no leftovers


def test_transformers_loads_it_and_generates(demo_llama_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_llama_dir)
    model = AutoModelForCausalLM.from_pretrained(demo_llama_dir)
    assert model.dtype == torch.float16
    inputs = tokenizer("The planner moves layers", return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert output.shape[1] == inputs.input_ids.shape[1] + 4
    text = tokenizer.decode(output[0], skip_special_tokens=True)
    assert text.startswith("The planner moves layers")


def test_bert_demo_has_mask_token_and_masked_lm_head(tmp_path: Path) -> None:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    folder = make_demo(tmp_path / "bert", arch="bert", params="1M", shards=2, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForMaskedLM.from_pretrained(folder)
    inputs = tokenizer(f"hello {tokenizer.mask_token}", return_tensors="pt")
    assert inputs.input_ids[0, 0].item() == tokenizer.cls_token_id
    logits = model(**inputs).logits
    assert logits.shape[-1] == model.config.vocab_size


@pytest.mark.parametrize(
    ("arch", "target"), [("llama", 2_000_000), ("gpt2", 60_000_000), ("bert", 500_000)]
)
def test_shape_lands_near_the_target(arch: str, target: int) -> None:
    shape = choose_shape(arch, target, vocab_size=774)
    assert abs(shape.param_count - target) / target < 0.2
    assert shape.hidden_size % 64 == 0 and shape.num_heads % shape.num_kv_heads == 0


def test_bad_arguments(tmp_path: Path, demo_llama_dir: Path) -> None:
    assert parse_count("60M") == 60_000_000 and parse_count("1.5k") == 1500
    with pytest.raises(ModelSourceError, match="'lots' is not a parameter count"):
        parse_count("lots")
    with pytest.raises(
        ModelSourceError, match="unknown demo arch 'rnn'; choose one of llama, gpt2, bert"
    ):
        make_demo(tmp_path / "x", arch="rnn")
    with pytest.raises(ModelSourceError, match="must be a floating dtype"):
        make_demo(tmp_path / "x", dtype="int8")
    with pytest.raises(ModelSourceError, match="--shards must be at least 1"):
        make_demo(tmp_path / "x", shards=0)
    with pytest.raises(ModelSourceError, match="already exists and is not empty"):
        make_demo(demo_llama_dir, params="1M")
    assert not (tmp_path / "x").exists()


_RACE = """
import sys
from workbench.models.demo import demo_model_dir
print(demo_model_dir("llama", "1M", cache_root=sys.argv[1]))
"""


@pytest.mark.slow
def test_cached_demo_is_made_once_even_when_two_processes_race(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=300)[0].strip() for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    target = tmp_path / "demo-llama-1m"
    assert outputs == [str(target), str(target)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo-llama-1m"]  # no temp folders left
    stamp = (target / "config.json").stat().st_mtime_ns
    assert demo_model_dir("llama", "1M", cache_root=tmp_path) == target
    assert (target / "config.json").stat().st_mtime_ns == stamp  # reused, not rebuilt
