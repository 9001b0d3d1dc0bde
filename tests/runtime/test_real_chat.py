"""The chat path on the real demo model (SmolLM2-135M-Instruct, converted once per test run and
shared): a question through its chat template gets a sensible greedy answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from real_model import real_model_dir  # noqa: F401 - the shared fixture

from workbench.big_modeling.progress import CancelToken
from workbench.runtime.jobs import JobRunner
from workbench.runtime.protocol import Infer, Load, Result, Verify

pytestmark = pytest.mark.slow


def test_the_real_demo_answers_a_question_through_its_chat_template(
    real_model_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    runner = JobRunner(lambda _event: None)
    try:
        load = Load(1, str(real_model_dir), {"": "cpu"}, "float32", str(tmp_path))
        loaded = runner.run(load, CancelToken())
        assert isinstance(loaded, Result) and loaded.value.chat_template, loaded
        question = (("user", "What is the capital of France?"),)
        final = runner.run(Infer(2, messages=question, max_new_tokens=24), CancelToken())
        assert isinstance(final, Result), final
        answer = final.value
        assert "Paris" in answer.text, answer.text
        assert answer.chat_template and "<|im_start|>assistant\n" in answer.prompt_text
        assert answer.stop_reason == "eos" and answer.new_tokens < 24  # it ends its turn
        # verify on readable text: logits, then the greedy continuation token by token
        check = Verify(3, prompt="The capital of France is", mode="full", greedy_tokens=8)
        verified = runner.run(check, CancelToken())
        assert isinstance(verified, Result), verified
        assert verified.value.passed and verified.value.greedy_identical
        assert "Paris" in verified.value.greedy_text, verified.value.greedy_text
    finally:
        runner.close()
