"""Which modules an inference run times, and which hardware its prediction is for."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from workbench.models import open_model
from workbench.models.attention_probe import cached_attention_times
from workbench.models.hardware import detect_hardware, list_profiles, with_host_probes
from workbench.models.speed import attention_shapes_for, predict_speed
from workbench.runtime.inference import predict_figures, timed_module_names
from workbench.runtime.planning import attention_layout
from workbench.runtime.protocol import PROBING_HOST, PROBING_WORKSPACE, InferenceResult, Result
from workbench.runtime.worker import WorkerHost


@pytest.fixture(scope="module")
def opened(demo_dir: Path) -> Any:
    return open_model(str(demo_dir))


@pytest.fixture(scope="module")
def laptop() -> Any:
    return next(p for p in list_profiles() if p.name == "cpu-laptop-16gb")


def test_a_whole_model_map_times_the_units_the_speed_model_predicts(
    opened: Any, laptop: Any
) -> None:
    loaded = SimpleNamespace(opened=opened, model=opened.model, device_map={"": "cpu"})
    names = timed_module_names(loaded)
    predicted = [layer.name for layer in predict_speed(opened, {"": "cpu"}, laptop).per_layer]
    assert names == predicted
    assert {"model.embed_tokens", "model.norm", "lm_head"} <= set(names)


def test_a_profile_sent_as_data_predicts_for_that_profile(opened: Any, laptop: Any) -> None:
    loaded = SimpleNamespace(opened=opened, model=opened.model, device_map={"": "cpu"})
    expected = predict_speed(opened, {"": "cpu"}, laptop, prompt_tokens=9)
    figures = predict_figures(loaded, laptop.to_dict(), 9)
    assert figures == {
        "tokens_per_s": expected.tokens_per_s,
        "ttft_s": expected.ttft_s,
        "forward_s": expected.prefill_s,  # what a run that generates nothing compares with
        "prompt_tokens": 9.0,
    }
    assert predict_figures(loaded, laptop.name, 9) == figures  # by name: the same hardware
    assert predict_figures(loaded, {"name": "broken"}, 9) == {}  # a bad profile: no figures
    # a run that generates nothing computes every position's logits: its forward is longer
    every = predict_speed(opened, {"": "cpu"}, laptop, prompt_tokens=9, last_position_only=False)
    forward = predict_figures(loaded, laptop.name, 9, generating=False)
    assert forward["forward_s"] == every.prefill_s > figures["forward_s"]


def test_this_machine_is_predicted_with_its_measured_host_costs(opened: Any) -> None:
    # the detected profile gains the dispatch and matmul probes (measured once, then cached)
    loaded = SimpleNamespace(opened=opened, model=opened.model, device_map={"": "cpu"})
    figures = predict_figures(loaded, None, 9)
    hardware = with_host_probes(detect_hardware())
    assert hardware.dispatch_measured and hardware.cpu_matmul_curve is not None
    # and the model's attention shape, timed on this CPU (cached: nothing measured here)
    shapes = attention_shapes_for(opened.tree, attention_layout(opened))
    assert [shape.key for shape in shapes] == ["float16 3/3 heads x 64/64"]  # the demo Llama
    times = cached_attention_times(shapes, measure_if_missing=False)
    assert list(times) == [shapes[0].key]
    expected = predict_speed(opened, {"": "cpu"}, hardware, prompt_tokens=9, attention_times=times)
    assert figures["tokens_per_s"] == pytest.approx(expected.tokens_per_s)
    assert figures["forward_s"] == pytest.approx(expected.prefill_s)
    layer = expected.per_layer[1]
    assert layer.name == "model.layers.0"
    assert layer.attention_s == pytest.approx(times[shapes[0].key].decode_seconds(9))
    assert layer.prefill_attention_s == pytest.approx(times[shapes[0].key].prefill_seconds(9))
    # a run that generated 8 tokens decoded over 9 + 4 cached tokens on average
    longer = predict_figures(loaded, None, 9, new_tokens=8)
    decoded = predict_speed(
        opened, {"": "cpu"}, hardware, prompt_tokens=9, attention_times=times, decode_context=13
    )
    assert longer["tokens_per_s"] == pytest.approx(decoded.tokens_per_s)


@pytest.mark.slow
def test_the_first_prediction_on_a_machine_announces_its_host_probes(
    opened: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))  # a machine never measured
    loaded = SimpleNamespace(opened=opened, model=opened.model, device_map={"": "cpu"})
    phases: list[str] = []
    first = predict_figures(loaded, None, 9, announce=phases.append)
    assert phases == [PROBING_HOST]  # before the seconds of measuring, in fresh processes
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cpu-attention.json",
        "cpu-matmul-curve.json",
        "dispatch-overhead.json",
    ]
    assert predict_figures(loaded, None, 9, announce=phases.append) == first  # from the caches
    assert phases == [PROBING_HOST]
    assert predict_figures(loaded, "cpu-laptop-16gb", 9, announce=phases.append)
    assert phases == [PROBING_HOST]  # a bundled profile is not this machine: nothing measured


@pytest.mark.slow
def test_the_worker_reports_every_unit_on_a_whole_model_cpu_map(
    host: WorkerHost, events: Any, demo_dir: Path, opened: Any, laptop: Any
) -> None:
    assert isinstance(events.final(host.load(demo_dir, {"": "cpu"})), Result)  # as stored
    final = events.final(host.infer(None, max_new_tokens=2, profile=laptop.to_dict()))
    assert isinstance(final, Result), final
    value = final.value
    assert isinstance(value, InferenceResult)
    rows = {row.module: row for row in value.per_layer}
    for unit in ("model.embed_tokens", "model.layers.0", "model.norm", "lm_head"):
        assert unit in rows and rows[unit].compute_s > 0, sorted(rows)
    expected = predict_speed(opened, {"": "cpu"}, laptop, prompt_tokens=value.prompt_tokens)
    assert value.predicted["ttft_s"] == pytest.approx(expected.ttft_s)
    assert value.predicted["prompt_tokens"] == value.prompt_tokens


@pytest.mark.slow
def test_the_worker_announces_a_matmul_workspace_probe_before_the_result(
    events: Any, demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, laptop: Any
) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path / "cache"))  # the worker inherits it
    host = WorkerHost(events, offload_root=tmp_path / "offload")
    try:
        assert isinstance(events.final(host.load(demo_dir, {"": "cpu"})), Result)
        runs = [host.infer("The planner", max_new_tokens=2, profile=laptop.to_dict())]
        assert isinstance(events.final(runs[0]), Result)
        runs.append(host.infer("The planner", max_new_tokens=2, profile=laptop.to_dict()))
        assert isinstance(events.final(runs[1]), Result)
    finally:
        host.shutdown()

    def phases(rid: int) -> list[str]:
        return [
            e.type_name if e.type_name != "Phase" else e.phase
            for e in events.events
            if getattr(e, "request_id", None) == rid and e.type_name in ("Phase", "Result")
        ]

    # the first run's shapes were never probed on this "machine": announced after the tokens,
    # before the result; the same run again reads the cache; a bundled profile probes no host
    assert phases(runs[0]) == ["generating", PROBING_WORKSPACE, "Result"]
    assert phases(runs[1]) == ["generating", "Result"]
