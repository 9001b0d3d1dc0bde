"""Inference and verify on models that take no text: synthetic inputs of the declared shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from workbench.big_modeling.progress import CancelToken
from workbench.runtime.jobs import JobRunner
from workbench.runtime.model_inputs import synthetic_shape
from workbench.runtime.protocol import (
    Event,
    Infer,
    InferenceResult,
    Load,
    Result,
    Verify,
    VerifyResult,
)

VIT_MAP = {
    "vit.embeddings": "cpu",
    "vit.layers.0": "cpu",
    "vit.layers.1": "disk",
    "vit.layernorm": "cpu",
    "classifier": "cpu",
}


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ViT image classifier: config.json plus two safetensors shards with an index."""
    from transformers import ViTConfig, ViTForImageClassification

    folder = tmp_path_factory.mktemp("vit") / "vit"
    config = ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
        num_channels=3,
        num_labels=5,
        architectures=["ViTForImageClassification"],
    )
    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in ViTForImageClassification(config).state_dict().items()}
    config.save_pretrained(folder)
    names = sorted(state)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(folder / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(keys, file)
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


@pytest.fixture
def runner(vit_dir: Path, tmp_path: Path) -> Iterator[JobRunner]:
    events: list[Event] = []
    job_runner = JobRunner(events.append)
    request = Load(1, source=str(vit_dir), device_map=VIT_MAP, offload_folder=str(tmp_path))
    loaded = job_runner.run(request, CancelToken())
    assert isinstance(loaded, Result), loaded
    assert loaded.value.model_class == "ViTForImageClassification"
    assert not loaded.value.is_causal_lm and not loaded.value.has_tokenizer
    yield job_runner
    job_runner.close()


def test_synthetic_shapes_follow_the_config() -> None:
    from transformers import Speech2TextConfig, ViTConfig, WhisperConfig

    assert synthetic_shape("pixel_values", ViTConfig(image_size=48, num_channels=1)) == (
        1,
        1,
        48,
        48,
    )
    whisper = WhisperConfig(num_mel_bins=40, max_source_positions=50)
    assert synthetic_shape("input_features", whisper) == (1, 40, 100)
    speech = Speech2TextConfig(input_feat_per_channel=20, input_channels=1)
    assert synthetic_shape("input_features", speech)[2] == 20
    assert synthetic_shape("input_values", None) == (1, 16_000)


def test_inference_on_a_vision_model_runs_one_timed_forward(runner: JobRunner) -> None:
    final = runner.run(Infer(2, prompt=None), CancelToken())
    assert isinstance(final, Result), final
    result = final.value
    assert isinstance(result, InferenceResult)
    assert result.prompt_tokens == 0 and result.new_tokens == 0 and result.text == ""
    assert result.ttft_s > 0 and result.tokens_per_s > 0  # forwards per second
    streamed = {t.module for t in result.per_layer if t.source == "disk" and t.nbytes > 0}
    assert streamed and all(name.startswith("vit.layers.1.") for name in streamed)
    blocks = {
        t.module: t.compute_s
        for t in result.per_layer
        if t.module in ("vit.layers.0", "vit.layers.1")
    }
    assert len(blocks) == 2 and all(s > 0 for s in blocks.values()), blocks


def test_verify_on_a_vision_model_matches_the_reference(runner: JobRunner) -> None:
    full = runner.run(Verify(3, mode="full"), CancelToken())
    assert isinstance(full, Result) and isinstance(full.value, VerifyResult), full
    assert full.value.passed and full.value.exact, full.value
    assert full.value.output_shape == (1, 5)  # logits over the 5 labels
    # Layer by layer, each unit's weights are fresh aligned copies while the dispatched model
    # computes on weights mapped from the file at unaligned offsets; CPU kernels may then round
    # differently in the last bit, so this mode is checked to a tolerance.
    layers = runner.run(Verify(4, mode="layers", atol=1e-6), CancelToken())
    assert isinstance(layers, Result) and isinstance(layers.value, VerifyResult), layers
    assert layers.value.passed and layers.value.max_abs_diff <= 1e-6, layers.value
    assert layers.value.reference.startswith("cpu, layer by layer")


def test_a_prompt_for_a_model_without_text_input_is_ignored_with_a_warning(
    runner: JobRunner, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="workbench"):
        final = runner.run(Infer(4, prompt="a cat"), CancelToken())
    assert isinstance(final, Result), final
    assert any("prompt is ignored" in r.getMessage() for r in caplog.records)
