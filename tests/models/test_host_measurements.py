"""This machine measured again: its cached host probes forgotten and taken anew (real probes,
in a cache folder of the test's own)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from workbench.models.cache_dirs import measure_probe, write_measurement_cache
from workbench.models.device_probe import (
    CpuKernelProbe,
    cpu_kernel_cache_key,
    cpu_kernels_entry_key,
)
from workbench.models.dispatch_probe import DispatchOverhead, dispatch_cache_key
from workbench.models.host_measurements import HostMeasurements, measure_host_again
from workbench.models.matmul_probe import MatmulCurve, matmul_curve_cache_key

CACHES = {
    "dispatch-overhead.json": "machines",
    "cpu-matmul-curve.json": "machines",
    "cpu-kernels.json": "devices",
}


def test_a_new_measurement_replaces_its_entry_only_and_a_failed_one_keeps_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "probe.json"
    earlier = {"per_module_s": 4e-5, "step_s": 1e-3, "threads": 2, "measured_at": 1.0}
    write_measurement_cache(path, "machines", {"this cpu": earlier, "other cpu": earlier})
    new = DispatchOverhead(2.5e-5, 4e-4, 2, 2.0)
    assert measure_probe(path, "machines", "this cpu", lambda: new, what="dispatch") == new
    entries = json.loads(path.read_text())["machines"]
    assert entries == {"this cpu": asdict(new), "other cpu": earlier}

    def fails() -> DispatchOverhead:
        raise RuntimeError("drowned by other load")

    assert measure_probe(path, "machines", "this cpu", fails, what="dispatch") is None
    assert json.loads(path.read_text())["machines"]["this cpu"] == asdict(new)  # kept


def test_the_summary_says_each_figure_or_that_it_failed() -> None:
    measured = HostMeasurements(
        DispatchOverhead(27.1e-6, 0.45e-3, 2, 0.0),
        MatmulCurve({"bfloat16": [[2**20, 2e-4], [2**22, 6e-4]]}, 2, 0.0),
        None,
    )
    assert measured.lines() == [
        "dispatch: 27.1 us per module call, 0.45 ms per forward (2 threads)",
        "cpu matmul curve: a 1 MiB weight takes bfloat16 200 us",
        "cpu kernels: not measured (see the log); typical efficiencies are used",
    ]
    assert measured.to_dict()["cpu_kernels"] is None
    # 1.7 ns x sqrt(3,540,096 parameters of the probe's 576-wide layer) = 3.2 us
    elementwise = DispatchOverhead(27.1e-6, 0.45e-3, 2, 0.0, elementwise_s=1.7e-9)
    curve = MatmulCurve(
        {"bfloat16": [[2**20, 2e-4], [2**22, 6e-4]]},
        2,
        0.0,
        prefill_flops={"float16": 30e9},
        transposed_prefill_rows_flops={"float16": [[8, 3e9], [128, 3.3e9]]},
    )
    assert HostMeasurements(elementwise, curve, None).lines()[:2] == [
        "dispatch: 27.1 us per module call, 0.45 ms per forward, elementwise work 3.2 us a token"
        " in a 576-wide layer (2 threads)",
        "cpu matmul curve: a 1 MiB weight takes bfloat16 200 us; a 128-token prefill runs at"
        " float16 30.0 GFLOP/s, with (in, out) weights (GPT-2's Conv1D) at float16 3.3 GFLOP/s",
    ]
    kernels = CpuKernelProbe(14.2, {"int8": 0.24, "plain": 1.0}, {}, 2, 2**24, 0.0)
    assert HostMeasurements(None, None, kernels).lines()[-1] == (
        "cpu kernels: bf16 reads 14.2 GB/s; of that: int8 0.24, plain 1.00"
    )


@pytest.mark.slow
def test_measuring_again_replaces_this_machines_cached_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    keys = {name: cpu_kernel_cache_key() for name in CACHES}
    keys["cpu-kernels.json"] = cpu_kernels_entry_key()
    keys["dispatch-overhead.json"] = dispatch_cache_key()
    keys["cpu-matmul-curve.json"] = matmul_curve_cache_key()
    stale = {"stale": True, "measured_at": 1.0}
    for name, field in CACHES.items():  # a busy first measurement, and another machine's
        key = keys[name]
        write_measurement_cache(tmp_path / name, field, {key: stale, "other cpu": stale})
    measured = measure_host_again()
    assert measured.matmul_curve is not None and measured.matmul_curve.points
    assert measured.cpu_kernels is not None and measured.cpu_kernels.bf16_gbps > 0
    # the dispatch probe refuses a measurement drowned by other load (the suite's other
    # processes): then the earlier entry stays, as for any probe that fails
    replaced = {
        "dispatch-overhead.json": measured.dispatch is not None,
        "cpu-matmul-curve.json": True,
        "cpu-kernels.json": True,
    }
    for name, field in CACHES.items():
        entries = json.loads((tmp_path / name).read_text())[field]
        key = keys[name]
        assert entries["other cpu"] == stale  # left alone
        if replaced[name]:
            assert entries[key]["measured_at"] > 1.0 and "stale" not in entries[key]
        else:
            assert entries[key] == stale
