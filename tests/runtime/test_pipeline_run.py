"""The real split: two gloo processes on loopback, each loading only its stage's tensors with
our engine, run a forward and greedy generation through ``torch.distributed.pipelining`` equal
to the single-process model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.loading.api import load_checkpoint_in_model
from workbench.big_modeling.loading.index import CheckpointIndex
from workbench.models.intake import open_model
from workbench.runtime.pipeline_run import (
    DecoderStage,
    PipelineJob,
    StageSpec,
    _load_stage,
    even_stages,
    planned_stages,
    run_pipeline,
)

PROMPT = [1, 5, 9, 11, 20, 33]
NEW_TOKENS = 5


def _single_process_model(folder: Path) -> torch.nn.Module:
    opened = open_model(folder)
    load_checkpoint_in_model(opened.model, folder, device_map={"": "cpu"}, dtype="float32")
    return opened.model.eval()


def _stage_checkpoint_bytes(
    folder: Path, first: int, count: int, *, first_stage: bool, last_stage: bool
) -> int:
    index = CheckpointIndex.from_path(folder)
    layers = tuple(f"model.layers.{i}." for i in range(first, first + count))
    wanted = (
        layers
        + (("model.embed_tokens.",) if first_stage else ())
        + (("model.norm.", "lm_head.") if last_stage else ())
    )
    return sum(info.nbytes for name, info in index.tensors.items() if name.startswith(wanted))


def test_even_stages_split_layers_contiguously_earlier_stages_take_the_extra():
    # 7 layers over 3 stages: 7 = 3 + 2 + 2
    assert [(s.first_layer, s.layer_count) for s in even_stages(7, 3)] == [(0, 3), (3, 2), (5, 2)]
    with pytest.raises(BadInputError, match=r"1\.\.4"):
        even_stages(4, 5)


def test_planned_stages_cover_every_layer_once(demo_dir: Path):
    opened = open_model(demo_dir)
    stages = planned_stages(opened, 2, chunk_tokens=16)
    layers = [i for s in stages for i in range(s.first_layer, s.first_layer + s.layer_count)]
    assert layers == list(range(opened.config.num_hidden_layers))
    assert all(s.planned_bytes > 0 for s in stages)


def test_a_model_that_is_not_llama_style_is_refused_by_name():
    opened = open_model("gpt2")
    with pytest.raises(BadInputError, match="GPT2LMHeadModel is not a Llama-style"):
        DecoderStage(opened.model, 0, 1, is_first=True, is_last=False)


def test_a_stage_reads_only_its_tensors_and_logs_nothing_about_the_others(demo_dir: Path, caplog):
    job = PipelineJob(str(demo_dir), (StageSpec(0, 0, 1), StageSpec(1, 1, 3)), (1, 2), 1, None, "")
    with caplog.at_level("WARNING"):
        module, loaded, _ = _load_stage(job, job.stages[1])
    assert not [r for r in caplog.records if "were not used" in r.getMessage()]
    # layers 1-3, the norm and lm_head: exactly their bytes, nothing of layer 0 or embeddings
    assert loaded.nbytes_read == _stage_checkpoint_bytes(
        demo_dir, 1, 3, first_stage=False, last_stage=True
    )
    assert sorted(module.model.layers) == ["1", "2", "3"]
    assert not hasattr(module.model, "embed_tokens")


@pytest.mark.slow  # two fresh interpreters import torch and transformers
def test_two_gloo_processes_generate_what_the_single_process_generates(demo_dir: Path):
    opened = open_model(demo_dir)
    stages = planned_stages(opened, 2, chunk_tokens=16)

    result = run_pipeline(str(demo_dir), stages, PROMPT, max_new_tokens=NEW_TOKENS, dtype="float32")

    assert result is not None
    model = _single_process_model(demo_dir)
    padded = torch.zeros((1, len(PROMPT) + NEW_TOKENS), dtype=torch.long)
    padded[0, : len(PROMPT)] = torch.tensor(PROMPT)
    with torch.no_grad():
        reference_logits = model(padded).logits[0, : len(PROMPT)]
        model.generation_config.eos_token_id = None  # random weights: never stop early
        generated = model.generate(
            torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True
        )
    # The same kernels on the same inputs in the same order: bitwise equal on CPU.
    torch.testing.assert_close(result.first_logits, reference_logits, rtol=0, atol=0)
    assert result.tokens == generated[0, len(PROMPT) :].tolist()
    # Each process read only its own stage's tensors from the shards.
    checkpoint_total = CheckpointIndex.from_path(demo_dir).total_nbytes
    last = len(stages) - 1
    for stage, report in zip(stages, result.stages, strict=True):
        own = _stage_checkpoint_bytes(
            demo_dir, stage.first_layer, stage.layer_count, first_stage=stage.index == 0,
            last_stage=stage.index == last,
        )  # fmt: skip
        assert report.nbytes_read == own < checkpoint_total
        assert report.rss_after_load > 0
    assert sum(report.nbytes_read for report in result.stages) == checkpoint_total
