"""A prompt longer than a model's learned position embedding is refused with a clear error
(before, GPT-2's forward failed with "IndexError: index out of range in self"); real demo
checkpoints loaded by the job runner."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.big_modeling.progress import CancelToken
from workbench.models.demo import make_demo
from workbench.runtime.jobs import JobRunner
from workbench.runtime.model_inputs import learned_position_limit
from workbench.runtime.protocol import Failed, Infer, InferenceResult, Load, Result, Verify

POSITIONS = 512  # the demos' max_position_embeddings (GPT-2: n_positions)


def _runner(folder: Path, offload: Path) -> JobRunner:
    runner = JobRunner(lambda event: None)
    loaded = runner.run(
        Load(1, source=str(folder), device_map={"": "cpu"}, offload_folder=str(offload)),
        CancelToken(),
    )
    assert isinstance(loaded, Result), loaded
    return runner


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobRunner]:
    root = tmp_path_factory.mktemp("positions")
    folder = make_demo(root / "gpt2", arch="gpt2", params="1M", shards=1, dtype="float32")
    runner = _runner(folder, root / "offload")
    yield runner
    runner.close()


def test_a_run_that_fits_the_positions_exactly_runs(gpt2: JobRunner) -> None:
    # 511 prompt tokens and 2 new ones: the second new token is never fed back, 512 positions
    final = gpt2.run(Infer(2, synthetic_tokens=POSITIONS - 1, max_new_tokens=2), CancelToken())
    assert isinstance(final, Result) and isinstance(final.value, InferenceResult), final
    assert final.value.prompt_tokens == POSITIONS - 1 and final.value.new_tokens == 2


@pytest.mark.parametrize(
    ("prompt", "new", "needed"), [(POSITIONS, 2, POSITIONS + 1), (POSITIONS + 1, 0, POSITIONS + 1)]
)
def test_one_position_more_is_refused_naming_the_counts(
    gpt2: JobRunner, prompt: int, new: int, needed: int
) -> None:
    final = gpt2.run(Infer(3, synthetic_tokens=prompt, max_new_tokens=new), CancelToken())
    assert isinstance(final, Failed) and final.kind == "bad_input", final
    assert f"the prompt's {prompt} tokens" in final.message
    assert f"need {needed} positions" in final.message
    assert f"learned position embeddings for {POSITIONS}" in final.message
    assert "IndexError" not in final.message
    assert ("fewer new tokens" in final.message) == bool(new)
    after = gpt2.run(Infer(4, synthetic_tokens=8, max_new_tokens=2), CancelToken())
    assert isinstance(after, Result), after  # the loaded model still runs


def test_verify_is_refused_too(gpt2: JobRunner) -> None:
    for mode in ("full", "layers"):
        final = gpt2.run(Verify(5, synthetic_tokens=POSITIONS + 1, mode=mode), CancelToken())
        assert isinstance(final, Failed) and final.kind == "bad_input", (mode, final)
        assert f"need {POSITIONS + 1} positions" in final.message


def test_rotary_positions_have_no_learned_limit(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    folder = make_demo(tmp_path / "llama", arch="llama", params="2M", shards=1)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.max_position_embeddings == POSITIONS
    assert learned_position_limit(model) is None  # rotary: computed, no table to run out of
