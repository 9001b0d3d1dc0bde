"""The CPU total of a real load: within 5% of the prediction in a real worker process, the
runtime overhead measured apart, and non-persistent buffers counted alike on both sides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from workbench.runtime.memory_prediction import without_non_persistent_buffers
from workbench.runtime.memory_readings import resident_weight_bytes
from workbench.runtime.protocol import LoadSummary, Result
from workbench.runtime.worker import WorkerHost

TOLERANCE = 0.05  # issue 21: the CPU total within 5%


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [None, "float32"], ids=["as-stored", "float32"])
def test_worker_load_cpu_total_is_within_5_percent(
    events: Any, demo_dir: Path, tmp_path: Path, dtype: str | None
) -> None:
    # as stored: a zero-copy load, the weights stay mapped from the checkpoint (file pages) and
    # the tokenizer's memory would be 10% of this 4 MB demo if it were in the figure; float32:
    # the weights are anonymous copies, made and freed tensor by tensor
    host = WorkerHost(events, offload_root=tmp_path / "offload")
    try:
        final = events.final(host.load(demo_dir, {"": "cpu"}, dtype=dtype))
    finally:
        host.shutdown()
    assert isinstance(final, Result), final
    summary = final.value
    assert isinstance(summary, LoadSummary) and summary.has_tokenizer
    cpu = summary.memory.device("cpu")
    assert cpu is not None and cpu.measured_bytes is not None
    # non-persistent buffers (rotary inv_freq) are in neither side: the weights agree exactly
    assert cpu.predicted_weights_bytes == cpu.measured_weights_bytes > 0
    assert abs(cpu.error_fraction) <= TOLERANCE, summary.memory.describe()
    if dtype is None:
        assert cpu.mapped_weights_bytes == cpu.measured_weights_bytes
    else:
        assert cpu.mapped_weights_bytes == 0
    # the imports, the empty model and the tokenizer: measured, shown apart, in no total
    assert cpu.runtime_bytes is not None and cpu.runtime_bytes > cpu.measured_bytes
    assert any("runtime overhead" in note for note in summary.memory.notes)


def _rotary_model() -> nn.Module:
    model = nn.Module()
    model.embed = nn.Embedding(8, 4)  # 32 floats
    model.layers = nn.ModuleList([nn.Linear(4, 4, bias=False) for _ in range(2)])  # 16 each
    model.rotary = nn.Module()
    model.rotary.register_buffer("inv_freq", torch.ones(2), persistent=False)  # 8 B
    model.layers[1].register_buffer("scratch", torch.ones(4), persistent=False)  # 16 B
    model.layers[1].register_buffer("scale", torch.ones(1))  # persistent: a weight, 4 B
    return model


def test_non_persistent_buffers_are_left_out_of_predicted_and_measured_weights() -> None:
    model = _rotary_model()
    sizes = {"": 32 * 4 + 2 * 16 * 4 + 8 + 16 + 4, "embed": 128, "rotary": 8}
    sizes |= {"layers.0": 64, "layers.1": 64 + 16 + 4, "rotary.inv_freq": 8}
    sizes |= {"layers.1.scratch": 16, "layers.1.scale": 4}
    device_map = {"embed": "cpu", "rotary": "cpu", "layers.0": "cpu", "layers.1": "disk"}
    placed = {"cpu": 128 + 8 + 64, "disk": 64 + 16 + 4}  # as the tree counts the entries
    predicted = without_non_persistent_buffers(placed, sizes, device_map, model)
    assert predicted == {"cpu": 128 + 64, "disk": 64 + 4}
    # the measured side: the same tensors, resident (all on the CPU in this undispatched model)
    assert resident_weight_bytes(model) == {"cpu": sum(predicted.values())}


def test_a_whole_model_map_and_a_tied_alias_take_each_buffer_off_once() -> None:
    model = _rotary_model()
    model.alias = model.rotary  # the same buffer under a second name: no tree entry of its own
    sizes = {"": 232, "rotary.inv_freq": 8, "layers.1.scratch": 16}
    assert without_non_persistent_buffers({"cpu": 232}, sizes, {"": "cpu"}, model) == {
        "cpu": 232 - 8 - 16
    }
    # a buffer no key covers (dispatch puts it on the main device) was never in the entries
    uncovered = {"embed": "cpu", "layers": "cpu"}
    assert without_non_persistent_buffers({"cpu": 200}, sizes, uncovered, model) == {
        "cpu": 200 - 16
    }
