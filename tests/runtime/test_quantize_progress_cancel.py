"""Progress and cancel while a load quantizes (issue 19 item 1).

The engine half runs ``quantize_model`` in process on a real cpu + disk load of the demo Llama
and cancels it from its own progress callback; the worker half parks a real quantized load in
the worker process half-way through quantizing (the tests' hold, which counts the quantized
modules on after the checkpoint's tensors), cancels it there, then loads again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from job_holds import hold_options

from workbench.big_modeling.errors import LoadCancelled
from workbench.big_modeling.progress import CancelToken, LoadProgress
from workbench.runtime.progress_throttle import ProgressThrottle
from workbench.runtime.protocol import Failed, Phase, Result
from workbench.runtime.worker import WorkerHost

INT8_LAYERS = {"model.layers": "int8"}
LINEARS_PER_LAYER = 7  # q, k, v, o, gate, up, down


def _linear_weight_nbytes(model: torch.nn.Module, prefix: str) -> int:
    return sum(
        module.weight.numel() * module.weight.element_size()
        for name, module in model.named_modules()
        if name.startswith(prefix) and isinstance(module, torch.nn.Linear)
    )


def _folder_state(folder: Path) -> dict[str, bytes]:
    """Every file of the offload folder with its bytes (``.dat`` files by size only)."""
    return {
        path.name: path.read_bytes() if path.suffix != ".dat" else str(path.stat().st_size).encode()
        for path in sorted(folder.iterdir())
    }


def _loaded(demo_dir: Path, device_map: dict[str, str], offload: Path) -> torch.nn.Module:
    from workbench.big_modeling.loading.api import load_checkpoint_in_model
    from workbench.models import open_model

    model = open_model(str(demo_dir), dtype=torch.float32).model
    load_checkpoint_in_model(
        model,
        demo_dir,
        device_map=device_map,
        offload_folder=offload,
        dtype=torch.float32,
        offload_state_dict=True,
    )
    return model


def test_a_cancelled_quantize_leaves_the_offload_folder_as_it_was(
    demo_dir: Path, cpu_disk_map: dict[str, str], tmp_path: Path
) -> None:
    from workbench.big_modeling.quantization.apply import quantize_model

    offload = tmp_path / "offload"
    model = _loaded(demo_dir, cpu_disk_map, offload)
    before = _folder_state(offload)
    assert "index.json" in before
    token = CancelToken()
    reports: list[LoadProgress] = []

    def cancel_on_the_second_disk_module(report: LoadProgress) -> None:
        reports.append(report)
        if report.tensor_name == "model.layers.1.self_attn.k_proj.weight":
            token.cancel()

    with pytest.raises(LoadCancelled):
        quantize_model(
            model,
            INT8_LAYERS,
            offload_folder=offload,
            progress=cancel_on_the_second_disk_module,
            cancel=token,
        )
    # two disk modules were packed into files before the cancel; both files and the index are
    # back as they were (the index never saw a torchao record)
    assert [r.tensor_name for r in reports[-2:]] == [
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight",
    ]
    assert _folder_state(offload) == before


def test_quantize_progress_counts_the_weight_bytes_up_to_the_total(
    demo_dir: Path, cpu_disk_map: dict[str, str], tmp_path: Path
) -> None:
    from workbench.big_modeling.quantization.apply import quantize_model

    offload = tmp_path / "offload"
    model = _loaded(demo_dir, cpu_disk_map, offload)
    total = _linear_weight_nbytes(model, "model.layers.")
    layers = len(model.model.layers)
    reports: list[LoadProgress] = []
    report = quantize_model(
        model, INT8_LAYERS, offload_folder=offload, progress=reports.append, cancel=CancelToken()
    )
    assert len(report.modules) == layers * LINEARS_PER_LAYER
    assert {r.phase for r in reports} == {"quantizing"} and {r.bytes_total for r in reports} == {
        total
    }
    assert reports[0].bytes_done == 0 and reports[0].tensor_name == ""
    done = [r.bytes_done for r in reports]
    assert done == sorted(done) and len(set(done)) == len(done) and done[-1] == total
    assert [r.tensor_name for r in reports[1:]] == [f"{m.name}.weight" for m in report.modules]
    index = json.loads((offload / "index.json").read_text())
    assert "torchao" in index["model.layers.1.mlp.up_proj.weight"]  # committed after the loop


def _held(request_id: int) -> Any:
    return lambda e: isinstance(e, Phase) and e.request_id == request_id and e.phase == "held"


@pytest.mark.slow
def test_cancel_while_the_worker_quantizes_then_load_again(
    host: WorkerHost,
    events: Any,
    demo_dir: Path,
    cpu_disk_map: dict[str, str],
    demo_config: dict,
    tmp_path: Path,
) -> None:
    tensors = len(json.loads((demo_dir / "model.safetensors.index.json").read_text())["weight_map"])
    # park after layer 0 (cpu, in place) and two modules of layer 1 (disk, packed into files)
    options = {"precision_map": INT8_LAYERS, **hold_options(tensors + LINEARS_PER_LAYER + 2)}
    load_id = host.load(demo_dir, cpu_disk_map, dtype="float32", options=options)
    folder = host.offload_folder
    events.wait_for(_held(load_id))
    phases = [e.phase for e in events.of("Phase") if e.request_id == load_id]
    assert phases[-2:] == ["quantizing", "held"], phases
    progress = [e for e in events.of("Progress") if e.request_id == load_id]
    quantizing = [e for e in progress if e.phase == "quantizing"]
    assert (
        quantizing[0].bytes_done == 0 and 0 < quantizing[-1].bytes_done < quantizing[-1].bytes_total
    )
    assert quantizing[-1].tensor == "model.layers.1.self_attn.k_proj.weight"
    packed = sorted(p.name for p in folder.iterdir() if ".quantized-" in p.name)
    assert len(packed) == 2, packed  # what a cancel has to take back
    index = json.loads((folder / "index.json").read_text())
    assert not any("torchao" in info for info in index.values())

    assert host.cancel()
    final = events.final(load_id)
    assert isinstance(final, Failed) and final.kind == "cancelled", final
    assert not folder.exists() and list((tmp_path / "offload").iterdir()) == []
    assert host.state == "idle" and host.is_alive()

    again = host.load(
        demo_dir, cpu_disk_map, dtype="float32", options={"precision_map": INT8_LAYERS}
    )
    result = events.final(again)
    assert isinstance(result, Result), result
    progress = [e for e in events.of("Progress") if e.request_id == again]
    quantizing = [e for e in progress if e.phase == "quantizing"]
    done = [e.bytes_done for e in quantizing]
    assert done[0] == 0 and done == sorted(done) and done[-1] == quantizing[-1].bytes_total > 0
    hidden, inner = demo_config["hidden_size"], demo_config["intermediate_size"]
    heads, kv_heads = demo_config["num_attention_heads"], demo_config["num_key_value_heads"]
    kv = hidden // heads * kv_heads
    per_layer = hidden * (2 * hidden + 2 * kv) + 3 * hidden * inner
    assert done[-1] == demo_config["num_hidden_layers"] * per_layer * 4  # float32 weights
    dispatching = [e for e in progress if e.phase == "dispatching"]
    loading = [e for e in progress if e.phase == "loading"]
    assert dispatching and dispatching[-1].bytes_done == loading[-1].bytes_done  # the load's bytes
    index = json.loads((host.offload_folder / "index.json").read_text())
    assert "torchao" in index["model.layers.1.mlp.up_proj.weight"]


def test_the_quantizing_eta_counts_from_the_start_of_quantizing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """100 s of loading, then half the weights quantized in 10 s: 10 s to go, not 110 s."""
    from workbench.runtime import progress_throttle

    clock = iter([0.0, 50.0, 100.0, 100.0, 110.0])  # made, loading x2, quantizing x2
    monkeypatch.setattr(progress_throttle.time, "monotonic", lambda: next(clock))
    sent: list[Any] = []
    throttle = ProgressThrottle(sent.append, 1, interval_s=0.0)
    throttle(LoadProgress(500, 1000, "a", "loading"))
    throttle(LoadProgress(1000, 1000, "b", "loading"))
    throttle(LoadProgress(0, 40, "", "quantizing"))
    throttle(LoadProgress(20, 40, "q.weight", "quantizing"))
    assert [(e.phase, e.eta_s) for e in sent] == [
        ("loading", 50.0),
        ("loading", None),
        ("quantizing", None),
        ("quantizing", 10.0),
    ]
