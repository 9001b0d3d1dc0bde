"""The CPU matmul workspace: which float32 matmuls a run makes, their buffers probed in a real
fresh process, the cache, and the run record that adds them to the CPU's predicted reserve."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from memory_model_configs import tiny_configs  # tests/, shared

from workbench.big_modeling import init_empty_weights
from workbench.runtime.gemm_workspace import (
    GemmCall,
    cpu_gemm_calls,
    cpu_gemm_workspace_bytes,
    probe_gemm_workspace,
)
from workbench.runtime.protocol import InferenceResult, Result
from workbench.runtime.worker import WorkerHost


def _model(case: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    config, model_class = tiny_configs()[case]  # hidden 64, MLP 128, vocab 100, 4 heads
    with init_empty_weights():
        return model_class(config).to(dtype)


def _llama(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    return _model("llama-gqa", dtype)


def test_a_float32_llama_on_the_cpu_prefills_then_decodes_one_token() -> None:
    calls = cpu_gemm_calls(_llama(), {"": "cpu"}, prompt_tokens=7, new_tokens=3)
    linear = [
        GemmCall("linear", 7, 64, 64, False),  # q_proj, o_proj
        GemmCall("linear", 7, 64, 32, False),  # k_proj, v_proj: 2 of 4 heads
        GemmCall("linear", 7, 64, 128, False),  # gate_proj, up_proj
        GemmCall("linear", 7, 128, 64, False),  # down_proj
        GemmCall("linear", 1, 64, 100, False),  # lm_head at one position (logits_to_keep)
    ]
    decode = [GemmCall("linear", 1, c.in_features, c.out_features, False) for c in linear[:4]]
    assert calls == tuple(linear + decode)


def test_one_forward_of_every_position_runs_the_head_on_all_of_them() -> None:
    calls = cpu_gemm_calls(_llama(), {"": "cpu"}, prompt_tokens=5, new_tokens=0)
    assert {call.rows for call in calls} == {5}
    assert GemmCall("linear", 5, 64, 100, False) in calls


def test_gpt2_conv1d_runs_addmm_with_its_weight_in_by_out() -> None:
    calls = cpu_gemm_calls(_model("gpt2-mha"), {"": "cpu"}, prompt_tokens=4, new_tokens=2)
    assert calls[:4] == (
        GemmCall("addmm", 4, 64, 192, True),  # c_attn: q, k and v together
        GemmCall("addmm", 4, 64, 64, True),  # attn.c_proj
        GemmCall("addmm", 4, 64, 256, True),  # mlp.c_fc
        GemmCall("addmm", 4, 256, 64, True),  # mlp.c_proj
    )
    assert GemmCall("linear", 1, 64, 100, False) in calls  # the tied head


def test_half_precision_weights_are_replayed_in_their_dtype_and_a_gpu_map_has_none() -> None:
    model = _llama()
    assert (
        cpu_gemm_calls(model, {"model": 0, "lm_head": "cpu"}, prompt_tokens=7, new_tokens=3) == ()
    )
    bf16 = cpu_gemm_calls(_llama(torch.bfloat16), {"": "cpu"}, prompt_tokens=7, new_tokens=3)
    assert bf16[0] == GemmCall("linear", 7, 64, 64, False, "bfloat16")
    assert {call.dtype for call in bf16} == {"bfloat16"}
    float64 = cpu_gemm_calls(_llama(torch.float64), {"": "cpu"}, prompt_tokens=7, new_tokens=3)
    assert float64 == ()  # no kernel this model covers


def test_disk_offloaded_layers_run_on_the_cpu_and_count() -> None:
    calls = cpu_gemm_calls(
        _llama(), {"model": "cpu", "lm_head": "disk"}, prompt_tokens=3, new_tokens=1
    )
    assert GemmCall("linear", 1, 64, 100, False) in calls


@pytest.mark.parametrize("precision", ["nf4", "int8", "int4-g64"])
def test_quantized_weights_that_run_a_dense_matmul_are_replayed_as_one(precision: str) -> None:
    if precision == "nf4":
        pytest.importorskip("bitsandbytes", reason="nf4 needs bitsandbytes (dev extra)")
    from workbench.big_modeling.quantization.backends import quantize_weight

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 64, bias=False))
    model = model.to(torch.bfloat16)
    model[0].weight = torch.nn.Parameter(quantize_weight(model[0].weight.data, precision), False)
    calls = cpu_gemm_calls(model, {"": "cpu"}, prompt_tokens=5, new_tokens=0)
    plain = GemmCall("linear", 5, 128, 64, False, "bfloat16")
    if precision == "int4-g64":  # tinygemm's own kernel: not a dense matmul
        assert calls == (plain,)
    else:  # nf4 (bnb4_cpu) and int8 (int8_cpu): dequantized, then one bfloat16 linear
        assert calls == (GemmCall("linear", 5, 64, 128, True, "bfloat16"), plain)


def test_the_probe_runs_the_calls_in_a_fresh_process_and_caches_the_figure(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cpu-gemm-workspace.json"
    calls = (
        GemmCall("linear", 64, 256, 1024, True),
        GemmCall("addmm", 64, 1024, 256, True, "float16"),
        GemmCall("linear", 1, 256, 1024, False, "bfloat16"),
    )
    measured = probe_gemm_workspace(calls, threads=1)
    # a few per-thread blocks and primitives at most, not the 1 MiB weights or the outputs
    assert 0 <= measured < 8 * 2**20

    seen: list[tuple[tuple[GemmCall, ...], tuple[GemmCall, ...]]] = []

    def measure(c: Any, w: Any) -> int:
        seen.append((tuple(c), tuple(w)))
        return 4096

    announced: list[int] = []

    def announce() -> None:
        announced.append(len(seen))

    for _ in range(2):
        nbytes = cpu_gemm_workspace_bytes(
            calls, cache_path=cache, measure=measure, before_measuring=announce
        )
        assert nbytes == 4096
    assert len(seen) == 1  # the second answer came from the cache file
    assert announced == [0]  # announced once, before the measurement, not for the cached one
    entries = json.loads(cache.read_text())["entries"]
    assert [entry["bytes"] for entry in entries.values()] == [4096]
    # calls already run in the process are replayed first, uncounted: another entry
    assert cpu_gemm_workspace_bytes(calls[1:], warm=calls[:1], cache_path=cache, measure=measure)
    assert seen[-1] == (calls[1:], calls[:1])
    assert cpu_gemm_workspace_bytes((), cache_path=cache, measure=measure) == 0


def test_a_failed_probe_is_none_and_a_bad_cache_is_measured_again(tmp_path: Path) -> None:
    cache = tmp_path / "cpu-gemm-workspace.json"
    calls = (GemmCall("linear", 8, 16, 16, False),)

    def fails(c: Any, w: Any) -> int:
        raise RuntimeError("the matmul workspace probe failed (exit 1)")

    assert cpu_gemm_workspace_bytes(calls, cache_path=cache, measure=fails) is None
    assert not cache.exists()
    cache.write_text("{ not json")
    assert cpu_gemm_workspace_bytes(calls, cache_path=cache, measure=lambda c, w: 7) == 7
    assert json.loads(cache.read_text())["version"] == 1


@pytest.mark.slow
def test_a_float32_run_in_the_worker_predicts_the_workspace_of_its_new_calls_only(
    events: Any, demo_dir: Path, tmp_path: Path
) -> None:
    host = WorkerHost(events, offload_root=tmp_path / "offload")
    try:
        assert isinstance(events.final(host.load(demo_dir, {"": "cpu"}, dtype="float32")), Result)
        first = events.final(host.infer("The planner", max_new_tokens=2))
        second = events.final(host.infer("The planner", max_new_tokens=2))
    finally:
        host.shutdown()
    assert isinstance(first, Result) and isinstance(first.value, InferenceResult)
    notes = first.value.memory.notes
    assert any(note.startswith("cpu matmul workspace: ") for note in notes), notes
    # the same shapes again: their buffers are in the worker already, nothing more predicted
    assert isinstance(second, Result)
    assert not any("matmul workspace" in note for note in second.value.memory.notes)
    reserve = first.value.memory.device("cpu").predicted_reserve_bytes
    assert second.value.memory.device("cpu").predicted_reserve_bytes <= reserve
