"""The host's dispatch cost of an eager forward: measured on this machine, cached, carried by
the detected profile and by profile files."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.models.device_probe import cpu_kernel_cache_key
from workbench.models.dispatch_probe import (
    ELEMENTWISE_LAYER_PARAMS,
    ELEMENTWISE_WIDTH,
    NO_ATTENTION,
    PROBE_WIDTH,
    DispatchOverhead,
    _no_attention,
    _probe_model,
    _wide_model,
    cached_dispatch_overhead,
    dispatch_cache_key,
    leaf_module_count,
    measure_dispatch_overhead,
    measure_elementwise_seconds,
)
from workbench.models.errors import ProfileError
from workbench.models.hardware import detect_hardware, load_profile, profile_from_dict
from workbench.models.hardware_profile import (
    DEFAULT_ELEMENTWISE_NS,
    DEFAULT_FORWARD_CALL_US,
    DEFAULT_MODULE_CALL_US,
)

PROBE = DispatchOverhead(
    per_module_s=25e-6, step_s=4e-4, threads=2, measured_at=0.0, elementwise_s=2e-9
)


def test_the_probe_times_real_decode_steps() -> None:
    probe = measure_dispatch_overhead(repeats=3)
    # four more Llama layers cost more than none; the wrapper's share is never negative
    assert probe.per_module_s > 0 and probe.step_s >= 0 and probe.threads >= 1
    assert probe.elementwise_s >= 0


def test_leaf_modules_are_the_calls_a_layer_makes() -> None:
    block = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Linear(2, 2)), nn.GELU())
    assert leaf_module_count(block) == 4
    assert leaf_module_count(nn.Linear(2, 2)) == 1


def test_the_probe_is_cached_per_machine(tmp_path: Path) -> None:
    path = tmp_path / "dispatch-overhead.json"
    assert cached_dispatch_overhead(cache_path=path, measure_if_missing=False) is None
    calls = []

    def measure() -> DispatchOverhead:
        calls.append(1)
        return PROBE

    assert cached_dispatch_overhead(measure, cache_path=path) == PROBE
    assert cached_dispatch_overhead(measure, cache_path=path) == PROBE and len(calls) == 1
    assert dispatch_cache_key() in json.loads(path.read_text())["machines"]
    path.write_text(json.dumps({"version": 1, "machines": {dispatch_cache_key(): {"x": 1}}}))
    assert cached_dispatch_overhead(measure, cache_path=path) == PROBE and len(calls) == 2


def test_an_entry_of_the_previous_revision_is_measured_again(tmp_path: Path) -> None:
    # revision 1 timed the probe's 64-wide matmuls too, which the matmul curve also counts;
    # revision 2 had no elementwise figure
    path = tmp_path / "dispatch-overhead.json"
    for old_key in (cpu_kernel_cache_key(), f"{cpu_kernel_cache_key()}, dispatch r2"):
        path.write_text(json.dumps({"version": 1, "machines": {old_key: asdict(PROBE)}}))
        assert cached_dispatch_overhead(cache_path=path, measure_if_missing=False) is None
    assert dispatch_cache_key().startswith(cpu_kernel_cache_key())


def test_the_probe_models_linears_run_no_matmul() -> None:
    # the matmul curve times each matmul call whole: the dispatch probe leaves them out
    model = _probe_model(2)
    layer = model.model.layers[0].mlp.up_proj
    hidden = torch.ones(1, 3, PROBE_WIDTH, dtype=torch.bfloat16)
    out = layer(hidden)
    assert out.shape == (1, 3, layer.out_features) and not out.any()
    assert layer(hidden) is out  # kept: no allocation per call either
    assert layer(hidden[:, :1]).shape == (1, 1, layer.out_features)


def test_the_elementwise_probe_runs_a_wide_llama_without_matmuls_or_attention() -> None:
    # what it times per token is what neither the matmul curve nor the attention probe times
    from transformers import AttentionInterface

    AttentionInterface.register(NO_ATTENTION, _no_attention)
    model = _wide_model(2)
    attention = model.model.layers[0].self_attn
    assert model.config.hidden_size == ELEMENTWISE_WIDTH
    assert model.config._attn_implementation == NO_ATTENTION
    assert sum(p.numel() for p in model.model.layers[0].parameters()) == ELEMENTWISE_LAYER_PARAMS
    outputs: list[torch.Tensor] = []
    attention.register_forward_hook(lambda module, args, out: outputs.append(out[0]))
    with torch.inference_mode():
        model(torch.arange(5)[None], logits_to_keep=1)
    assert outputs[0].shape == (1, 5, ELEMENTWISE_WIDTH) and not outputs[0].any()
    assert not model.model.layers[0].mlp.down_proj(torch.ones(1, 2, 1536).bfloat16()).any()
    seconds = measure_elementwise_seconds(repeats=1)
    assert math.isfinite(seconds) and seconds >= 0


def test_a_failed_measurement_leaves_the_typical_values(tmp_path: Path) -> None:
    def broken() -> DispatchOverhead:
        raise RuntimeError("no transformers here")

    path = tmp_path / "dispatch-overhead.json"
    assert cached_dispatch_overhead(broken, cache_path=path) is None
    assert not path.exists()


def test_the_detected_profile_carries_the_measured_dispatch(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    unmeasured = detect_hardware(measure_links=False, measure_host_probes=False)
    assert not unmeasured.dispatch_measured
    assert (unmeasured.module_call_us, unmeasured.forward_call_us) == (
        DEFAULT_MODULE_CALL_US,
        DEFAULT_FORWARD_CALL_US,
    )
    cached_dispatch_overhead(lambda: PROBE)
    profile = detect_hardware(measure_links=False, measure_host_probes=False)
    assert profile.dispatch_measured
    assert profile.module_call_us == pytest.approx(25.0)
    assert profile.forward_call_us == pytest.approx(400.0)
    assert profile.elementwise_ns == pytest.approx(2.0)
    assert unmeasured.elementwise_ns == DEFAULT_ELEMENTWISE_NS
    assert "dispatch measured (25 us per module call, 0.4 ms per forward)" in profile.description


def test_a_profile_file_gives_its_dispatch_costs() -> None:
    data = load_profile("rtx4090-64gb").to_dict()
    assert "module_call_us" not in data  # the typical values are left out of the file
    custom = profile_from_dict({**data, "module_call_us": 8, "forward_call_us": 0})
    assert (custom.module_call_us, custom.forward_call_us) == (8.0, 0.0)
    assert profile_from_dict(custom.to_dict()) == custom
    with pytest.raises(ProfileError, match=r"'module_call_us' must be 0 or more, got -1$"):
        profile_from_dict({**data, "module_call_us": -1})
    assert "elementwise_ns" not in data
    elementwise = profile_from_dict({**data, "elementwise_ns": 0.9})
    assert elementwise.elementwise_ns == 0.9
    assert profile_from_dict(elementwise.to_dict()) == elementwise
    with pytest.raises(ProfileError, match=r"'elementwise_ns' must be 0 or more, got 'x'$"):
        profile_from_dict({**data, "elementwise_ns": "x"})
