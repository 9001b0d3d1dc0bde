"""``workbench run --json``: predicted and measured memory per device, after the load and the
run, through the real worker process; the text output prints the same table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cpu_disk_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A small llama demo and a map: layer 0 and the rest on the CPU, the other layers on disk."""
    from workbench.models import make_demo

    root = tmp_path_factory.mktemp("run-memory")
    folder = make_demo(root / "demo", arch="llama", params="2M", shards=2)
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu"}
    device_map |= {f"model.layers.{i}": "disk" for i in range(1, layers)}
    device_map |= {"model.norm": "cpu", "lm_head": "cpu"}
    map_file = root / "map.json"
    map_file.write_text(json.dumps(device_map))
    return folder, map_file


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
