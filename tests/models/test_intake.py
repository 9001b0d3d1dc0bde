"""Opening models: folders with weights, bare configs, bundled names, the HF cache, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hub_cache import make_hub_cache_entry

from workbench.big_modeling.errors import BadInputError
from workbench.models.errors import ModelSourceError
from workbench.models.hf_cache import list_cached_models
from workbench.models.intake import open_model


def test_folder_sizes_come_from_the_checkpoint_index(demo_llama_dir: Path) -> None:
    opened = open_model(demo_llama_dir)
    assert opened.model_class == "LlamaForCausalLM"
    assert opened.checkpoint is not None and len(opened.checkpoint.files) == 3
    # every checkpoint tensor counted as stored, plus the non-persistent rotary buffers
    buffers = dict(opened.model.named_buffers())
    extra = sum(
        b.numel() * b.element_size() for n, b in buffers.items() if n not in opened.checkpoint
    )
    assert extra > 0
    assert opened.tree.root.stored_nbytes == opened.checkpoint.total_nbytes + extra
    assert opened.declared_dtype == torch.float16
    assert opened.no_split_modules == ["LlamaDecoderLayer"]
    assert opened.tokenizer_dir == demo_llama_dir
    assert opened.missing_keys == [] and opened.unexpected_keys == []
    # LlamaForCausalLM declares lm_head.weight as tyable, but this demo unties it
    assert opened.config.tie_word_embeddings is False
    assert opened.tied_groups == [] and opened.tied_weight_keys == []
    assert next(opened.model.parameters()).device.type == "meta"
    layer = opened.tree.node("model.layers.0")
    assert layer.no_split and layer.class_name == "LlamaDecoderLayer"
    # planning in float32 doubles every floating weight (all fp16 on disk)
    as_fp32 = opened.with_dtype("float32")
    assert as_fp32.tree.root.nbytes == 2 * opened.checkpoint.total_nbytes + extra  # buffers fp32
    assert as_fp32.model is opened.model


def test_param_count_matches_the_real_model(demo_gpt2_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    opened = open_model(demo_gpt2_dir)
    real = AutoModelForCausalLM.from_pretrained(demo_gpt2_dir)
    assert opened.tree.root.param_count == sum(p.numel() for p in real.parameters())
    assert opened.tied_groups == [["lm_head.weight", "transformer.wte.weight"]]
    assert opened.tied_weight_keys == ["lm_head.weight"]
    assert opened.tree.node("lm_head").tied


def test_bare_config_and_bundled_name(demo_llama_dir: Path, tmp_path: Path) -> None:
    shutil.copy(demo_llama_dir / "config.json", tmp_path / "config.json")
    bare = open_model(tmp_path / "config.json")
    assert bare.checkpoint is None and bare.folder is None and bare.tokenizer_dir is None
    assert bare.tree.root.param_count == open_model(demo_llama_dir).tree.root.param_count
    gpt2 = open_model("gpt2")
    assert gpt2.tree.root.param_count == 124_439_808  # GPT-2 small, head tied to wte
    assert gpt2.declared_dtype == torch.float32
    untied = open_model("llama-3.1-8b")  # tie_word_embeddings: false
    assert untied.tied_groups == [] and untied.tied_weight_keys == []


def _write_config(folder: Path, data: dict | str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _llama_config(**overrides: object) -> dict:
    base = json.loads(
        (Path(__file__).parents[2] / "resources/configs/tiny-llama-demo.json").read_text()
    )
    base.update(overrides)
    return {key: value for key, value in base.items() if value is not None}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"model_type": "llama",', r"not valid JSON \(line 1, column"),
        ("[1, 2]", r"must hold a JSON object, found list"),
        (_llama_config(model_type=None), r"has no 'model_type'"),
        (_llama_config(model_type="lama"), r"model_type 'lama' is unknown .*close names .*llama"),
        (
            _llama_config(hidden_size=None, vocab_size=None),
            r"missing required fields for llama: hidden_size, vocab_size",
        ),
        (
            # transformers' defaults (11008, 32 heads) would open a 38.5M model, not 3.2M
            _llama_config(intermediate_size=None, num_attention_heads=None),
            r"missing required fields for llama: intermediate_size, num_attention_heads; "
            "without them transformers would use defaults",
        ),
        (
            {
                "model_type": "qwen3_moe",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "vocab_size": 100,
                "intermediate_size": 128,
                "num_attention_heads": 4,
            },
            r"missing required fields for qwen3_moe: moe_intermediate_size, "
            r"num_local_experts \(or num_experts\);",
        ),
        (
            _llama_config(intermediate_size=-5),  # refused before transformers builds it
            r"'intermediate_size' must be a whole number of at least 1, got -5",
        ),
    ],
    ids=[
        "bad-json",
        "not-object",
        "no-model-type",
        "unknown-type",
        "missing-fields",
        "missing-size-fields",
        "missing-moe-fields",
        "unbuildable",
    ],
)
def test_bad_configs_say_what_is_wrong(tmp_path: Path, config: dict | str, message: str) -> None:
    path = _write_config(tmp_path / "m", config)
    with pytest.raises(ModelSourceError, match=message) as caught:
        open_model(path)
    assert str(path) in str(caught.value) or "transformers could not build" in str(caught.value)
    assert isinstance(caught.value, BadInputError) and isinstance(caught.value, ValueError)


def test_a_non_utf8_config_names_the_file_byte_and_offset(tmp_path: Path) -> None:
    folder = tmp_path / "latin1"
    folder.mkdir()
    path = folder / "config.json"
    path.write_bytes('{"model_type": "llama", "name": "caf\u00e8"}'.encode("latin-1"))
    with pytest.raises(ModelSourceError) as caught:
        open_model(folder)
    assert str(caught.value).startswith(f"{path}: not UTF-8 text (byte 0xe8 at offset 36)")
    assert "codec" not in str(caught.value)


def test_bad_sources_say_what_to_open(tmp_path: Path, demo_llama_dir: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("x")
    with pytest.raises(ModelSourceError, match=r"empty has no config.json \(it holds: notes.txt\)"):
        open_model(tmp_path / "empty")
    shard = next(demo_llama_dir.glob("*.safetensors"))
    with pytest.raises(ModelSourceError, match="is a weights file; open the folder"):
        open_model(shard)
    with pytest.raises(
        ModelSourceError,
        match=r"not a file, folder or bundled config\. Did you mean: llama-3.1-70b",
    ):
        open_model("llama-3.1-71b")
    with pytest.raises(BadInputError, match="is not a torch dtype"):
        open_model(demo_llama_dir, dtype="float13")


def test_hf_cache_lists_and_opens_offline(
    tmp_path: Path, demo_llama_dir: Path, monkeypatch
) -> None:
    cache = tmp_path / "hub"
    snapshot = make_hub_cache_entry(cache, "acme/tiny-llama", demo_llama_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    cached = list_cached_models()
    assert [model.repo_id for model in cached] == ["acme/tiny-llama"]
    assert cached[0].has_config and cached[0].has_weights
    assert cached[0].snapshot_path == snapshot
    opened = open_model("hf-cache:acme/tiny-llama")
    assert opened.folder == snapshot and opened.checkpoint is not None
    assert open_model("acme/tiny-llama").folder == snapshot  # a bare repo id works too
    with pytest.raises(
        ModelSourceError,
        match=r"'acme/tiny-lama' is not in the local Hugging Face cache.*acme/tiny-llama",
    ):
        open_model("hf-cache:acme/tiny-lama")


def test_missing_cache_lists_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "nowhere"))
    assert list_cached_models() == []


def test_building_skips_meta_initialisation_but_restores_transformers_init_table() -> None:
    import transformers.initialization as hf_init

    before = dict(hf_init.TORCH_INIT_FUNCTIONS)
    opened = open_model("gpt2")
    assert all(p.is_meta for p in opened.model.parameters())
    assert ["lm_head.weight", "transformer.wte.weight"] in opened.tied_groups  # tying still runs
    assert before == hf_init.TORCH_INIT_FUNCTIONS
