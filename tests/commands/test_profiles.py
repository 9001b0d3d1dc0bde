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
