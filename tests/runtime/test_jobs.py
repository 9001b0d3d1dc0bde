"""Load, infer and verify jobs run in process (the CLI's path): maps, corruption, throttling."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from job_holds import HOLD_OBSERVER, hold_options

from workbench.big_modeling.progress import CancelToken, LoadProgress
from workbench.runtime.jobs import (
    JobRunner,
    ObservedLoad,
    import_load_observer,
    iter_job,
)
from workbench.runtime.progress_throttle import ProgressThrottle
from workbench.runtime.protocol import (
    Event,
    Failed,
    Infer,
    InferenceResult,
    Load,
    Phase,
    Progress,
    Result,
    TokenStreamed,
    TransferBatch,
    Verify,
    VerifyResult,
)
from workbench.runtime.verify_compare import compare_outputs

ALL_DISK_LAYERS = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers": "disk",
    "model.norm": "disk",
    "lm_head": "disk",
}


@pytest.fixture
def runner() -> Iterator[JobRunner]:
    events: list[Event] = []
    job_runner = JobRunner(events.append)
    job_runner.events = events  # type: ignore[attr-defined]
    yield job_runner
    job_runner.close()


def _load(runner: JobRunner, demo_dir: Path, device_map: dict, folder: Path, **kw: Any) -> Any:
    final = runner.run(
        Load(1, source=str(demo_dir), device_map=device_map, offload_folder=str(folder), **kw),
        CancelToken(),
    )
    assert isinstance(final, Result), final
    return final.value


@pytest.mark.slow
@pytest.mark.parametrize("map_name", ["cpu", "cpu+disk", "disk layers"])
def test_verify_passes_bitwise_on_several_maps(
    runner: JobRunner,
    demo_dir: Path,
    demo_config: dict,
    tmp_path: Path,
    cpu_disk_map: dict,
    map_name: str,
) -> None:
    device_map = {"cpu": {"": "cpu"}, "cpu+disk": cpu_disk_map, "disk layers": ALL_DISK_LAYERS}[
        map_name
    ]
    _load(runner, demo_dir, device_map, tmp_path, dtype="float32")
    final = runner.run(Verify(2, prompt="Memory, bandwidth and compute"), CancelToken())
    assert isinstance(final, Result), final
    result = final.value
    assert isinstance(result, VerifyResult)
    assert result.passed and result.exact
    assert result.max_abs_diff == 0.0 and result.max_rel_diff == 0.0
    assert result.output_shape[-1] == demo_config["vocab_size"]
    layered = runner.run(
        Verify(3, prompt="Memory, bandwidth and compute", mode="layers"), CancelToken()
    )
    assert layered.value.passed and layered.value.exact, layered
    assert layered.value.worst_module == ""


@pytest.mark.slow
def test_verify_detects_a_corrupted_weight_in_memory_and_on_disk(
    runner: JobRunner, demo_dir: Path, tmp_path: Path, cpu_disk_map: dict
) -> None:
    _load(runner, demo_dir, cpu_disk_map, tmp_path, dtype="float32")
    # on disk: overwrite the start of an offloaded weight's raw file in the offload folder
    index = json.loads((tmp_path / "index.json").read_text())
    name = "model.layers.2.mlp.down_proj.weight"
    assert index[name]["dtype"] == "float32"
    raw = tmp_path / f"{name}.dat"
    with open(raw, "r+b") as handle:
        handle.write(torch.full((16,), 3.0).numpy().tobytes())
    result = runner.run(Verify(2, prompt="The planner", mode="full"), CancelToken()).value
    assert isinstance(result, VerifyResult)
    assert not result.passed and not result.exact
    assert result.max_abs_diff > 0
    # layer by layer (for models too big for a full copy) also names the corrupt unit
    layered = runner.run(Verify(5, prompt="The planner", mode="layers"), CancelToken()).value
    assert not layered.passed and layered.worst_module == "model.layers.2"

    # in memory: a CPU-resident weight changed after loading
    runner2 = JobRunner(lambda e: None)
    _load(runner2, demo_dir, {"": "cpu"}, tmp_path / "second", dtype="float32")
    with torch.no_grad():
        runner2.loaded.model.model.layers[0].mlp.up_proj.weight[0, 0] += 0.5
    result = runner2.run(Verify(3, prompt="The planner"), CancelToken()).value
    assert not result.passed and result.max_abs_diff > 0
    # a tolerance loose enough to hide the change makes it pass: the bar is the caller's
    loose = runner2.run(Verify(4, prompt="The planner", atol=10.0), CancelToken()).value
    assert loose.passed and not loose.exact


@pytest.mark.slow
def test_generation_streams_tokens_and_reports_transfers(
    runner: JobRunner, demo_dir: Path, tmp_path: Path, cpu_disk_map: dict
) -> None:
    _load(runner, demo_dir, cpu_disk_map, tmp_path, dtype="float32")
    runner.events.clear()  # type: ignore[attr-defined]
    final = runner.run(Infer(2, prompt=None, max_new_tokens=4, synthetic_tokens=5), CancelToken())
    assert isinstance(final, Result), final
    result = final.value
    assert isinstance(result, InferenceResult)
    assert result.prompt_tokens == 5 and result.new_tokens == 4
    events = runner.events  # type: ignore[attr-defined]
    streamed = [e for e in events if isinstance(e, TokenStreamed)]
    batches = [e for e in events if isinstance(e, TransferBatch)]
    assert [t.token_id for t in streamed] == list(result.token_ids)
    # the pieces add up to the final text; only a trailing partial character is held back
    assert "".join(t.text for t in streamed) == result.text.rstrip("\ufffd")
    assert [b.forward_index for b in batches] == [0, 1, 2, 3]  # one batch per forward
    # every forward streams both disk layers in again: bytes per forward are the same
    disk_bytes = [sum(e.nbytes for e in b.events if e.source == "disk") for b in batches]
    assert disk_bytes[0] > 0 and len(set(disk_bytes)) == 1

    # greedy decoding is deterministic: the same request gives the same tokens
    again = runner.run(Infer(3, prompt=None, max_new_tokens=4, synthetic_tokens=5), CancelToken())
    assert again.value.token_ids == result.token_ids

    # a cancelled generation stops between tokens and keeps the model loaded
    token = CancelToken()
    token.cancel()
    cancelled = runner.run(Infer(4, max_new_tokens=4), token)
    assert isinstance(cancelled, Failed) and cancelled.kind == "cancelled"
    assert runner.loaded is not None


def test_progress_throttle_passes_phases_and_the_final_report() -> None:
    sent: list[Event] = []
    throttle = ProgressThrottle(sent.append, 9, interval_s=3600.0)
    for i in range(1, 1001):
        throttle(LoadProgress(i * 10, 10_000, f"t{i}", "loading"))
    throttle(LoadProgress(10_000, 10_000, "", "dispatching"))
    progress = [e for e in sent if isinstance(e, Progress)]
    # first report, the final byte of loading, the phase change: nothing in between
    assert [(p.bytes_done, p.phase) for p in progress] == [
        (10, "loading"),
        (10_000, "loading"),
        (10_000, "dispatching"),
    ]
    assert throttle.tensors_seen == 1000
    assert progress[0].eta_s is not None and progress[0].eta_s >= 0


def test_a_load_observer_sees_the_tensor_count_and_the_options_untouched(
    demo_dir: Path, tmp_path: Path
) -> None:
    observed: list[ObservedLoad] = []
    counts: list[int] = []

    def observer(load: ObservedLoad) -> Any:
        observed.append(load)
        return counts.append

    token = CancelToken()
    runner = JobRunner(lambda e: None, load_observer=observer)
    options = {"anything": [1, 2], "hold_after_tensors": 1}  # not the runner's to read
    request = Load(
        1,
        source=str(demo_dir),
        device_map={"": "cpu"},
        dtype="float32",
        offload_folder=str(tmp_path),
        options=options,
    )
    try:
        assert isinstance(runner.run(request, token), Result)
    finally:
        runner.close()
    assert len(observed) == 1
    assert observed[0].request is request and observed[0].token is token
    assert request.options == options
    tensors = len(json.loads((demo_dir / "model.safetensors.index.json").read_text())["weight_map"])
    assert counts == sorted(counts) and counts[-1] == tensors
    assert set(range(1, tensors + 1)) <= set(counts)  # called after every tensor's report


def test_the_tests_hold_parks_a_load_until_it_is_cancelled(demo_dir: Path, tmp_path: Path) -> None:
    token = CancelToken()
    events: list[Event] = []

    def emit(event: Event) -> None:
        events.append(event)
        if isinstance(event, Phase) and event.phase == "held":
            token.cancel()  # on the loading thread, inside the hold: its wait returns at once

    runner = JobRunner(emit, load_observer=import_load_observer(HOLD_OBSERVER))
    request = Load(
        1,
        source=str(demo_dir),
        device_map={"": "cpu"},
        dtype="float32",
        offload_folder=str(tmp_path),
        options=hold_options(3),
    )
    try:
        failed = runner.run(request, token)
    finally:
        runner.close()
    assert isinstance(failed, Failed) and failed.kind == "cancelled", failed
    assert "last phase: held" in failed.details
    held = next(i for i, e in enumerate(events) if isinstance(e, Phase) and e.phase == "held")
    flushed = events[held - 1]  # the hold flushes the progress of its 3 tensors first
    assert isinstance(flushed, Progress) and flushed.tensor and flushed.bytes_done > 0


def test_import_load_observer_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="expected 'module:function'"):
        import_load_observer("job_holds")
    with pytest.raises(AttributeError):
        import_load_observer("job_holds:no_such_observer")
    with pytest.raises(TypeError, match="not callable"):
        import_load_observer("job_holds:HOLD_LIMIT_S")
    assert callable(import_load_observer(HOLD_OBSERVER))


def test_iter_job_yields_events_until_the_final_one(tmp_path: Path) -> None:
    runner = JobRunner(lambda e: None)
    events = list(
        iter_job(
            runner, Load(1, source=str(tmp_path / "nope"), device_map={"": "cpu"}), CancelToken()
        )
    )
    assert isinstance(events[-1], Failed) and events[-1].kind == "bad_input"


def test_compare_outputs_reports_abs_and_rel() -> None:
    expected = torch.tensor([[1.0, -4.0], [2.0, 0.5]])
    actual = expected.clone()
    actual[1, 0] += 0.25
    result = compare_outputs(actual, expected, atol=0.1)
    assert not result.passed and not result.exact
    assert result.max_abs_diff == 0.25
    assert result.max_rel_diff == 0.25 / 4.0  # relative to max |expected|
    assert result.worst_position == (1, 0)
    assert compare_outputs(actual, expected, atol=0.3).passed
    with pytest.raises(ValueError, match="shapes differ"):
        compare_outputs(actual[0], expected)


def test_unknown_verify_mode_is_bad_input(
    runner: JobRunner, demo_dir: Path, tmp_path: Path
) -> None:
    _load(runner, demo_dir, {"": "cpu"}, tmp_path, dtype="float32")
    failed = runner.run(Verify(2, mode="fast"), CancelToken())
    assert isinstance(failed, Failed) and failed.kind == "bad_input"
    assert "verify mode 'fast' is unknown" in failed.message


@pytest.mark.slow
def test_encoder_runs_one_forward_and_verifies(
    runner: JobRunner, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from workbench.models import make_demo

    folder = make_demo(tmp_path_factory.mktemp("bert") / "demo", arch="bert", params="2M", shards=1)
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    device_map = {"bert.embeddings": "cpu", "cls": "cpu"}
    device_map |= {f"bert.encoder.layer.{i}": "disk" if i else "cpu" for i in range(layers)}
    summary = _load(runner, folder, device_map, tmp_path_factory.mktemp("offload"), dtype="float32")
    assert not summary.is_causal_lm
    runner.events.clear()  # type: ignore[attr-defined]
    result = runner.run(
        Infer(2, prompt="Memory decides what can stay", max_new_tokens=8), CancelToken()
    ).value
    assert isinstance(result, InferenceResult)
    assert result.new_tokens == 0 and result.prompt_tokens > 1  # one forward, no generation
    assert result.tokens_per_s > 0 and result.ttft_s > 0
    # its speed is one forward's time: the prediction to compare is the forward, no decode step
    assert result.one_forward and result.stop_reason == "forward"
    predicted = result.predicted
    assert 0 < predicted["forward_s"] == predicted["ttft_s"]  # the forward yields token one
    assert predicted["prompt_tokens"] == result.prompt_tokens
    batches = [e for e in runner.events if isinstance(e, TransferBatch)]  # type: ignore[attr-defined]
    assert len(batches) == 1
    assert any(t.source == "disk" and t.nbytes > 0 for t in result.per_layer)
    verified = runner.run(Verify(3, prompt="Memory decides what can stay"), CancelToken()).value
    assert verified.passed and verified.exact


def test_streaming_holds_back_a_partial_character_until_it_completes() -> None:
    from workbench.runtime.inference import next_piece

    tokenizer_bytes = "naïve".encode()  # "ï" is two bytes, as a byte-level tokenizer splits it
    decoded = [tokenizer_bytes[:n].decode(errors="replace") for n in range(1, 7)]
    streamed, pieces = "", []
    for text in decoded:
        piece, streamed = next_piece(text, streamed)
        pieces.append(piece)
    assert pieces == ["n", "a", "", "ï", "v", "e"]
    assert "".join(pieces) == "naïve"
    assert next_piece("rewritten", "naïve") == ("", "naïve")  # never streams a contradiction
