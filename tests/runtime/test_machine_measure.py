"""Measuring this machine from the window's side: ``workbench measure --json`` in a child
process, its figures parsed, and Cancel killing it."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from workbench.models.device_probe import cpu_kernel_cache_key
from workbench.models.host_measurements import HostMeasurements
from workbench.runtime import LoadCancelled
from workbench.runtime.machine_measure import MachineMeasurement


@pytest.mark.slow
def test_a_measurement_returns_the_figures_the_child_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))  # the child inherits it
    measured = MachineMeasurement().run()
    assert isinstance(measured, HostMeasurements)
    assert measured.matmul_curve is not None and measured.cpu_kernels is not None
    assert (tmp_path / "cpu-matmul-curve.json").is_file()
    # the dispatch probe may refuse a measurement drowned by the suite's other processes
    if measured.dispatch is not None:
        assert measured.dispatch.per_module_s > 0
        assert (tmp_path / "dispatch-overhead.json").is_file()


def test_cancel_kills_the_child_and_the_run_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    earlier = {"machines": {cpu_kernel_cache_key(): {"per_module_s": 4e-5, "step_s": 1e-3}}}
    (tmp_path / "dispatch-overhead.json").write_text(json.dumps(earlier))
    measurement = MachineMeasurement()
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            measurement.run()
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert measurement.started.wait(60)  # the child runs
    measurement.cancel()
    thread.join(60)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], LoadCancelled), outcome
    assert measurement.exit_code == -9  # killed, not finished
    # stopped before any probe finished: the earlier figure stands, in the cache too
    assert json.loads((tmp_path / "dispatch-overhead.json").read_text()) == earlier
    with pytest.raises(LoadCancelled):  # a cancelled measurement does not start again
        measurement.run()
