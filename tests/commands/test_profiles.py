"""``workbench profiles``: listing, one profile, JSON, unknown names."""

from __future__ import annotations

import json


def test_lists_bundled_and_detected(cli) -> None:
    code, out, _ = cli("profiles")
    assert code == 0
    for name in ("detected", "rtx4090-64gb", "2x-h100-80gb", "cpu-laptop-16gb", "h200-141gb"):
        assert name in out
    assert "host->device 25 GB/s" in out


def test_one_profile_as_json(cli) -> None:
    code, out, _ = cli("profiles", "2x-h100-80gb", "--json")
    assert code == 0
    (profile,) = json.loads(out)
    assert [d["device"] for d in profile["devices"]] == [0, 1, "cpu", "disk"]
    assert profile["devices"][0]["memory"] == 80 * 2**30
    assert profile["source"].endswith("2x-h100-80gb.json")


def test_unknown_profile_exits_2(cli) -> None:
    code, _, err = cli("profiles", "rtx5090")
    assert code == 2 and "unknown hardware profile 'rtx5090'; known profiles:" in err


def test_a_profile_with_zero_bandwidth_exits_2(cli, tmp_path) -> None:
    path = tmp_path / "zero.json"
    path.write_text(
        json.dumps({"disk_read_gbps": 0, "devices": [{"device": "cpu", "memory": "1MiB"}]})
    )
    code, out, err = cli("profiles", str(path))
    assert (code, out) == (2, "")
    assert (
        err == f"error: hardware profile {path}: 'disk_read_gbps' must be a number above 0, got 0\n"
    )
    code, out, err = cli("plan", "tiny-llama-demo", "--profile", str(path))
    assert (code, out) == (2, "")
    assert "'disk_read_gbps' must be a number above 0" in err


def test_each_profile_says_how_its_budgets_are_made(cli) -> None:
    from workbench.models.hardware import load_profile

    code, out, _ = cli("profiles", "2x-h100-80gb")
    assert code == 0
    profile = load_profile("2x-h100-80gb")
    lines = out.splitlines()
    # each GPU: 80 GiB less the bundled safety margin (models.hardware's budget_words)
    assert lines[1] == f"    {profile.budget_description()}"
    assert lines[1].startswith("    budgets: cuda:0 80 GiB - ") and "margin = " in lines[1]
    code, out, _ = cli("profiles", "cpu-laptop-16gb", "--json")
    assert json.loads(out)[0]["budget_description"] == "budgets: full memory"
    code, out, _ = cli("profiles")
    detected = out.splitlines()[:2]  # its description already says how its budgets are made
    assert detected[0].startswith("detected") and not detected[1].startswith("    budgets:")
