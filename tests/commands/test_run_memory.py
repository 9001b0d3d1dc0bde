"""``workbench run --json``: predicted and measured memory per device, after the load and the
run, through the real worker process; the text output prints the same table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.cli import main

pytestmark = pytest.mark.slow


def test_run_json_has_predicted_and_measured_per_device(
    cpu_disk_demo: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    folder, map_file = cpu_disk_demo
    args = ["run", str(folder), "--device-map", str(map_file), "--prompt", "The planner"]
    code = main([*args, "--max-new-tokens", "2", "--dtype", "float32", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(out)
    load = {row["device"]: row for row in report["load"]["memory"]["devices"]}
    run = {row["device"]: row for row in report["inference"]["memory"]["devices"]}
    assert set(load) == set(run) == {"cpu", "disk"}
    placed = report["load"]["nbytes_by_device"]
    for device in ("cpu", "disk"):
        assert load[device]["predicted_weights_bytes"] == placed[device]
        assert load[device]["measured_weights_bytes"] > 0
        assert load[device]["error_fraction"] == pytest.approx(
            (load[device]["predicted_bytes"] - load[device]["measured_bytes"])
            / load[device]["measured_bytes"]
        )
    assert run["cpu"]["predicted_bytes"] > run["cpu"]["predicted_weights_bytes"]  # + reserve
    assert run["disk"]["read_bytes"] > 0
    assert report["inference"]["memory"]["context_tokens"] > 0


def test_run_text_output_prints_the_memory_table(
    cpu_disk_demo: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    folder, map_file = cpu_disk_demo
    args = ["run", str(folder), "--device-map", str(map_file), "--max-new-tokens", "1"]
    assert main([*args, "--in-process"]) == 0
    out = capsys.readouterr().out
    assert "memory after the load, predicted against measured:" in out
    assert "memory during the run, predicted against measured:" in out
    header = next(line for line in out.splitlines() if "predicted weights" in line)
    assert header.split() == [
        "device",
        "predicted",
        "weights",
        "measured",
        "weights",
        "predicted",
        "total",
        "measured",
        "error",
        "read",
        "from",
        "disk",
    ]
