"""This machine measured again: its cached host probes forgotten and taken anew (real probes,
in a cache folder of the test's own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.models.cache_dirs import forget_probe, write_measurement_cache
from workbench.models.device_probe import CpuKernelProbe, cpu_kernel_cache_key
from workbench.models.dispatch_probe import DispatchOverhead
from workbench.models.host_measurements import HostMeasurements, measure_host_again
from workbench.models.matmul_probe import MatmulCurve

CACHES = {
    "dispatch-overhead.json": "machines",
    "cpu-matmul-curve.json": "machines",
    "cpu-kernels.json": "devices",
}


def test_forgetting_a_probe_removes_its_entry_only(tmp_path: Path) -> None:
    path = tmp_path / "probe.json"
    write_measurement_cache(path, "machines", {"this cpu": {"a": 1}, "other cpu": {"a": 2}})
    assert forget_probe(path, "machines", "this cpu")
    assert json.loads(path.read_text())["machines"] == {"other cpu": {"a": 2}}
    assert not forget_probe(path, "machines", "this cpu")  # nothing left to forget
    assert not forget_probe(tmp_path / "missing.json", "machines", "this cpu")


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
    kernels = CpuKernelProbe(14.2, {"int8": 0.24, "plain": 1.0}, {}, 2, 2**24, 0.0)
    assert HostMeasurements(None, None, kernels).lines()[-1] == (
        "cpu kernels: bf16 reads 14.2 GB/s; of that: int8 0.24, plain 1.00"
    )


@pytest.mark.slow
def test_measuring_again_replaces_this_machines_cached_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    key = cpu_kernel_cache_key()
    stale = {"stale": True, "measured_at": 1.0}
    for name, field in CACHES.items():  # a busy first measurement, and another machine's
        write_measurement_cache(tmp_path / name, field, {key: stale, "other cpu": stale})
    measured = measure_host_again()
    assert measured.dispatch is not None and measured.dispatch.per_module_s > 0
    assert measured.matmul_curve is not None and measured.matmul_curve.points
    assert measured.cpu_kernels is not None and measured.cpu_kernels.bf16_gbps > 0
    for name, field in CACHES.items():
        entries = json.loads((tmp_path / name).read_text())[field]
        assert entries["other cpu"] == stale  # left alone
        assert entries[key]["measured_at"] > 1.0 and "stale" not in entries[key]
