"""``workbench run SOURCE --pipeline-stages N``: the split from the command line."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow  # two fresh interpreters import torch and transformers
def test_run_with_two_pipeline_stages_reports_each_stage(cli, demo_dir):
    code, out, _ = cli(
        "run", str(demo_dir), "--pipeline-stages", "2", "--max-new-tokens", "3",
        "--dtype", "float32", "--json",
    )  # fmt: skip
    assert code == 0
    document = json.loads(out)
    assert len(document["tokens"]) == 3
    stages = document["stages"]
    assert [s["rank"] for s in stages] == [0, 1]
    assert stages[0]["first_layer"] == 0
    assert stages[1]["first_layer"] == stages[0]["layer_count"]
    assert all(s["nbytes_read"] > 0 and s["rss_after_load"] > 0 for s in stages)


def test_pipeline_stages_and_a_device_map_exclude_each_other(cli, demo_dir, tmp_path):
    device_map = tmp_path / "map.json"
    device_map.write_text('{"": "cpu"}')
    code, _, err = cli(
        "run", str(demo_dir), "--pipeline-stages", "2", "--device-map", str(device_map)
    )  # fmt: skip
    assert code == 2
    assert "exclude each other" in err


def test_more_stages_than_layers_is_bad_input(cli, demo_dir):
    code, _, err = cli("run", str(demo_dir), "--pipeline-stages", "99")
    assert code == 2
    assert "--pipeline-stages must be 1.." in err
