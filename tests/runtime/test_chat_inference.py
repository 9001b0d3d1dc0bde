"""The chat path and sampling: chat templates, end-of-turn stops, seeded sampling, the greedy
token-by-token verify, on a real (random-weight) Llama run in process and through the worker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from chat_demo import make_chat_demo

from workbench.big_modeling.progress import CancelToken
from workbench.runtime.chat import chat_prompt, plain_chat_text, stop_token_ids
from workbench.runtime.inference import generate_tokens
from workbench.runtime.jobs import JobRunner
from workbench.runtime.protocol import (
    Failed,
    Infer,
    InferenceResult,
    Load,
    Result,
    Sampling,
    TokenStreamed,
    Verify,
    VerifyResult,
)
from workbench.runtime.sampling import TokenPicker, describe_sampling, sampling_dict

CHAT = (("system", "Be brief."), ("user", "What does the planner do?"))


@pytest.fixture(scope="module")
def chat_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_chat_demo(tmp_path_factory.mktemp("chat") / "demo")


@pytest.fixture(scope="module")
def runner(chat_demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobRunner]:
    """The chat demo loaded in process: layer 0 on the CPU, the other layers on disk."""
    config = json.loads((chat_demo / "config.json").read_text())
    device_map: dict[str, int | str] = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu"}
    device_map |= {f"model.layers.{i}": "disk" for i in range(1, config["num_hidden_layers"])}
    device_map |= {"model.layers.0": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
    events: list[Any] = []
    job_runner = JobRunner(events.append)
    job_runner.events = events  # type: ignore[attr-defined]
    folder = tmp_path_factory.mktemp("offload")
    load = Load(1, str(chat_demo), device_map, "float32", str(folder))
    final = job_runner.run(load, CancelToken())
    assert isinstance(final, Result), final
    assert final.value.chat_template is True  # the load says the model can chat
    yield job_runner
    job_runner.close()


def _infer(runner: JobRunner, **fields: Any) -> InferenceResult:
    final = runner.run(Infer(7, **fields), CancelToken())
    assert isinstance(final, Result), final
    return final.value


def test_a_chat_is_built_with_the_models_template_and_streams_its_answer(
    runner: JobRunner,
) -> None:
    runner.events.clear()  # type: ignore[attr-defined]
    result = _infer(runner, messages=CHAT, max_new_tokens=5)
    expected_prompt = (
        "<s>system\nBe brief.</s>\n<s>user\nWhat does the planner do?</s>\n<s>assistant\n"
    )
    assert result.chat_template and result.prompt_text == expected_prompt
    tokenizer = runner.loaded.tokenizer
    assert result.prompt_tokens == len(tokenizer(expected_prompt, add_special_tokens=False)[0])
    assert result.sampling == {"greedy": True} and result.stop_reason in ("eos", "max_new_tokens")
    streamed = [e for e in runner.events if isinstance(e, TokenStreamed)]  # type: ignore[attr-defined]
    assert [e.token_id for e in streamed] == list(result.token_ids)
    assert "".join(e.text for e in streamed) == result.text.rstrip("\ufffd")


def test_a_chat_without_a_template_is_plain_role_lines(runner: JobRunner) -> None:
    tokenizer = runner.loaded.tokenizer
    template, tokenizer.chat_template = tokenizer.chat_template, None
    try:
        prompt = chat_prompt(tokenizer, CHAT)
    finally:
        tokenizer.chat_template = template
    assert not prompt.chat_template
    assert prompt.text == "System: Be brief.\nUser: What does the planner do?\nAssistant:"
    assert prompt.text == plain_chat_text(CHAT)


def test_generation_ends_at_an_end_of_turn_token(runner: JobRunner) -> None:
    model, tokenizer = runner.loaded.model, runner.loaded.tokenizer
    assert stop_token_ids(model, tokenizer) == {tokenizer.eos_token_id}  # generation_config.json
    ids = chat_prompt(tokenizer, CHAT).input_ids
    with torch.inference_mode():
        free = list(generate_tokens(model, ids, 6, TokenPicker(Sampling())))
        # the third token ends the turn when it is a stop id: generation stops right after it
        stopped = list(generate_tokens(model, ids, 6, TokenPicker(Sampling()), stop_ids={free[2]}))
    assert stopped == free[: free.index(free[2]) + 1]


def test_the_same_seed_gives_the_same_text_and_top_k_1_is_greedy(runner: JobRunner) -> None:
    greedy = _infer(runner, prompt="The planner", max_new_tokens=6)
    sampled = Sampling(greedy=False, temperature=1.5, top_p=0.95, top_k=0, seed=3)
    first = _infer(runner, prompt="The planner", max_new_tokens=6, sampling=sampled)
    again = _infer(runner, prompt="The planner", max_new_tokens=6, sampling=sampled)
    assert first.token_ids == again.token_ids
    assert first.sampling == sampling_dict(sampled) and first.sampling["seed"] == 3
    seeds = {
        _infer(
            runner, prompt="The planner", max_new_tokens=6, sampling=Sampling(False, 1.5, seed=s)
        ).token_ids
        for s in range(4)
    }
    assert len(seeds) > 1  # the seed matters at temperature 1.5 on random weights
    top1 = _infer(
        runner, prompt="The planner", max_new_tokens=6, sampling=Sampling(False, 2.0, top_k=1)
    )
    assert top1.token_ids == greedy.token_ids


def test_a_strong_repetition_penalty_repeats_no_token(runner: JobRunner) -> None:
    tokenizer = runner.loaded.tokenizer
    prompt_ids = set(tokenizer("The planner")["input_ids"])
    plain = _infer(runner, prompt="The planner", max_new_tokens=12)
    penalised = _infer(
        runner,
        prompt="The planner",
        max_new_tokens=12,
        sampling=Sampling(repetition_penalty=1e4),
    )
    assert len(set(plain.token_ids)) < len(plain.token_ids)  # random weights repeat themselves
    assert len(set(penalised.token_ids)) == len(penalised.token_ids)
    assert not prompt_ids & set(penalised.token_ids)
    assert penalised.sampling == {"greedy": True, "repetition_penalty": 1e4}


def test_bad_sampling_settings_are_bad_input_naming_each(runner: JobRunner) -> None:
    bad = Sampling(greedy=False, temperature=0.0, top_p=1.5, top_k=-1)
    final = runner.run(Infer(8, prompt="x", sampling=bad), CancelToken())
    assert isinstance(final, Failed) and final.kind == "bad_input"
    for name in ("temperature", "top_p", "top_k"):
        assert name in final.message
    chat_ends_with_assistant = (("user", "hi"), ("assistant", "hello"))
    final = runner.run(Infer(9, messages=chat_ends_with_assistant), CancelToken())
    assert isinstance(final, Failed) and final.kind == "bad_input"
    assert "must end with the user's turn" in final.message


def test_verify_compares_the_greedy_continuation_token_by_token(runner: JobRunner) -> None:
    final = runner.run(
        Verify(10, prompt="The planner", mode="full", greedy_tokens=6), CancelToken()
    )
    assert isinstance(final, Result), final
    value = final.value
    assert isinstance(value, VerifyResult) and value.passed and value.exact
    assert value.greedy_compared == 6 and value.greedy_matched == 6 and value.greedy_identical
    assert value.greedy_text == value.greedy_reference_text
    greedy = _infer(runner, prompt="The planner", max_new_tokens=6)
    assert value.greedy_text == greedy.text  # the same continuation the Run shows


def test_stop_during_a_forward_ends_it_before_the_next_layer(runner: JobRunner) -> None:
    """The user presses Stop while layer 0 computes the first token: layer 1 never runs, so a
    slow token cannot outlast the host's cancel grace period."""
    token = CancelToken()
    layers = runner.loaded.model.model.layers
    finished: list[int] = []

    def stop_after_layer_0(*_: Any) -> None:
        finished.append(0)
        token.cancel()

    def layer_1_ran(*_: Any) -> None:
        finished.append(1)

    handles = [
        layers[0].register_forward_hook(stop_after_layer_0),
        layers[1].register_forward_hook(layer_1_ran),
    ]
    try:
        final = runner.run(Infer(11, prompt="The planner", max_new_tokens=4), token)
    finally:
        for handle in handles:
            handle.remove()
    assert isinstance(final, Failed) and final.kind == "cancelled", final
    assert finished == [0]
    again = _infer(runner, prompt="The planner", max_new_tokens=2)  # the model still works
    assert again.new_tokens == 2


def test_top_p_and_top_k_keep_only_the_likely_tokens() -> None:
    # probabilities 0.5, 0.3, 0.15, 0.05: top-p 0.7 keeps the first two (0.5 < 0.7 <= 0.8)
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    picker = TokenPicker(Sampling(greedy=False, temperature=1.0, top_p=0.7, seed=0))
    assert {picker.pick(logits, []) for _ in range(200)} == {0, 1}
    picker = TokenPicker(Sampling(greedy=False, temperature=1.0, top_k=3, seed=0))
    assert {picker.pick(logits, []) for _ in range(400)} == {0, 1, 2}
    # a penalty of 4 on token 0 (log 0.5 < 0: multiplied) leaves token 1 the most likely
    assert TokenPicker(Sampling(repetition_penalty=4.0)).pick(logits, [0]) == 1
    assert describe_sampling(sampling_dict(Sampling(False, 0.7, 0.9, 50, 1.1, 5))) == (
        "temperature 0.7, top-p 0.9, top-k 50, seed 5, repetition penalty 1.1"
    )


@pytest.mark.slow
def test_a_chat_through_the_worker(host: Any, events: Any, chat_demo: Path) -> None:
    assert isinstance(events.final(host.load(chat_demo, {"": "cpu"}, dtype="float32")), Result)
    final = events.final(host.infer(messages=CHAT, max_new_tokens=3, sampling=Sampling()))
    assert isinstance(final, Result), final
    assert final.value.chat_template and final.value.prompt_text.startswith("<s>system\n")
    assert final.value.predicted_for == "detected"
