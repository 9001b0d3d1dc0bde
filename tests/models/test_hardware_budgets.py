"""Hardware profile budgets: memory held by others, the per-backend safety margin, and the
host-to-device bandwidth measured once per GPU and cached (issue 21)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from workbench.models import device_probe
from workbench.models.device_probe import (
    LinkBandwidth,
    cached_link_bandwidth,
    measure_host_to_device,
    safety_margin_bytes,
)
from workbench.models.errors import ProfileError
from workbench.models.hardware import (
    detect_hardware,
    load_profile,
    profile_from_dict,
)

GIB = 2**30
MIB = 2**20


def _write(folder: Path, name: str, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def test_a_profile_written_before_the_new_fields_still_loads(tmp_path: Path) -> None:
    # the format as it was: no held, no safety_margin, no pageable bandwidth
    old = {
        "name": "old-box",
        "description": "One 16 GB GPU, 32 GB RAM",
        "host_to_device_gbps": 12.0,
        "disk_read_gbps": 3.0,
        "devices": [
            {"device": 0, "name": "GPU", "memory": "16GiB", "compute_tflops": 50},
            {"device": "cpu", "name": "RAM", "memory": "32GiB"},
        ],
    }
    profile = load_profile(_write(tmp_path, "old-box", old))
    gpu = profile.device(0)
    assert gpu.held_bytes is None and gpu.margin_bytes is None
    # 16 GiB - (512 MiB + int(0.02 * 16 GiB) = 343597383 B)
    assert profile.budgets() == {0: 16 * GIB - 512 * MIB - 343597383, "cpu": 32 * GIB}
    assert profile.pageable_gbps == 6.0  # half the pinned 12 GB/s when not given
    assert not profile.links_measured
    assert "held" not in profile.to_dict()["devices"][0]


def test_held_memory_and_a_margin_from_the_file_come_off_the_budget(tmp_path: Path) -> None:
    data = {
        "host_to_device_gbps": 25.0,
        "host_to_device_pageable_gbps": 9.5,
        "devices": [
            {"device": 0, "memory": "24GiB", "held": "1GiB", "safety_margin": "2GiB"},
            {"device": 1, "memory": "24GiB", "held": "3GiB"},
            {"device": "cpu", "memory": "64GiB", "held": "8GiB"},
        ],
    }
    profile = load_profile(_write(tmp_path, "busy", data))
    # GPU 0: 24 - 1 held - 2 margin = 21 GiB; GPU 1: 24 - 3 held - (0.5 GiB + 2 % of 24 GiB);
    # RAM: 64 - 8 held, no margin
    assert profile.budgets() == {
        0: 21 * GIB,
        1: 21 * GIB - 512 * MIB - 515396075,
        "cpu": 56 * GIB,
    }
    assert profile.pageable_gbps == 9.5
    assert profile.device(0).budget_words() == "24 GiB - 1 GiB held - 2 GiB margin = 21 GiB"
    description = profile.budget_description()
    assert description.startswith("budgets: cuda:0 24 GiB - 1 GiB held - 2 GiB margin")
    assert "cpu 64 GiB - 8 GiB held = 56 GiB" in description
    again = profile_from_dict(profile.to_dict())
    assert again == profile and again.budgets() == profile.budgets()


def test_held_above_memory_is_refused_naming_the_device(tmp_path: Path) -> None:
    path = _write(tmp_path, "bad", {"devices": [{"device": 0, "memory": "8GiB", "held": "9GiB"}]})
    with pytest.raises(ProfileError, match=r"devices\[0\]: 'held' \(9 GiB\) is more than 'memory'"):
        load_profile(path)


def test_margins_are_per_backend() -> None:
    assert safety_margin_bytes("cpu", 64 * GIB) == 0
    assert safety_margin_bytes("disk", 2 * 10**12) == 0
    # 80 GiB GPU: 512 MiB + int(0.02 * 80 GiB) = 536870912 + 1717986918 B
    assert safety_margin_bytes(0, 80 * GIB) == 536870912 + 1717986918
    assert load_profile("cpu-laptop-16gb").budget_description() == "budgets: full memory"


def test_detected_hardware_without_a_gpu_says_its_links_are_typical(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: its links are measured")
    profile = detect_hardware(offload_folder=tmp_path)
    assert not profile.links_measured and profile.accelerators == ()
    assert "link bandwidths are typical values" in profile.description
    cpu = profile.device("cpu")
    assert cpu.budget_bytes == cpu.free_bytes  # RAM has no margin
    assert f"cpu {cpu.budget_words()}" in profile.description


def test_link_bandwidth_is_measured_once_per_device_and_cached(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache" / "link-bandwidth.json"
    measured: list[str] = []

    def measure(name: str, gbps: float):
        def run() -> LinkBandwidth:
            measured.append(name)
            return LinkBandwidth(gbps, gbps / 2, 256 * MIB, 1.0e9)

        return run

    first = cached_link_bandwidth("GPU-A uuid-1", measure("A", 24.0), cache)
    again = cached_link_bandwidth("GPU-A uuid-1", measure("A", 99.0), cache)
    other = cached_link_bandwidth("GPU-B uuid-2", measure("B", 50.0), cache)
    assert measured == ["A", "B"]  # the second call for A read the cache
    assert first == again == LinkBandwidth(24.0, 12.0, 256 * MIB, 1.0e9)
    assert other.pinned_gbps == 50.0
    written = json.loads(cache.read_text())
    assert written["version"] == 1 and set(written["devices"]) == {"GPU-A uuid-1", "GPU-B uuid-2"}
    assert [p.name for p in cache.parent.iterdir()] == [cache.name]  # no temp file left

    cache.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger=device_probe.__name__):
        remeasured = cached_link_bandwidth("GPU-A uuid-1", measure("A", 30.0), cache)
    assert remeasured.pinned_gbps == 30.0 and "not valid JSON" in caplog.text
    assert set(json.loads(cache.read_text())["devices"]) == {"GPU-A uuid-1"}


@pytest.mark.gpu
def test_a_timed_copy_measures_pinned_faster_than_pageable() -> None:
    link = measure_host_to_device(0, nbytes=64 * MIB)
    assert link.nbytes == 64 * MIB
    assert link.pageable_gbps > 0 and 0 < link.pinned_gbps < 2000  # below any HBM rate
    assert link.pinned_gbps >= 0.8 * link.pageable_gbps  # pinned is never much slower


@pytest.mark.gpu
def test_detected_gpus_subtract_what_others_hold(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    before = detect_hardware()
    holding = torch.empty(512 * MIB, dtype=torch.uint8, device="cuda:0")
    after = detect_hardware()
    # the tensor's 512 MiB (at least) is held now; the margin is the same
    assert after.device(0).held_bytes - before.device(0).held_bytes >= 512 * MIB
    assert after.budgets()[0] <= before.budgets()[0] - 512 * MIB
    assert (tmp_path / "link-bandwidth.json").is_file()  # measured and cached
    del holding
