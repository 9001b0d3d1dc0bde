"""Hardware profiles: bundled, user, detected; malformed files; sizes."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest
import torch

from workbench.models import hardware
from workbench.models.errors import ProfileError
from workbench.models.hardware import (
    detect_hardware,
    list_profiles,
    load_profile,
    profile_for_budgets,
    profile_from_dict,
)

GIB = 2**30


def test_bundled_profiles_and_their_budgets() -> None:
    names = [profile.name for profile in list_profiles()]
    assert {"rtx4090-64gb", "2x-h100-80gb", "cpu-laptop-16gb", "h200-141gb"} <= set(names)
    # GPU: 24 GiB - the CUDA margin, 512 MiB + 2 % of 24 GiB = 536870912 + 515396075 B
    assert load_profile("rtx4090-64gb").budgets() == {
        0: 24 * GIB - 536870912 - 515396075,
        "cpu": 64 * GIB,
        "disk": 2 * 10**12,
    }
    two = load_profile("2x-h100-80gb")
    assert [spec.device for spec in two.accelerators] == [0, 1]
    assert two.device("cuda:1").memory_bandwidth_gbps == 3350.0
    laptop = load_profile("cpu-laptop-16gb")
    assert laptop.accelerators == () and laptop.budgets()["cpu"] == 16 * GIB
    with pytest.raises(ProfileError, match="has no device 0; it has cpu, disk"):
        laptop.device(0)


def _write(folder: Path, name: str, data: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_user_profiles_add_and_override(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    folder = tmp_path / "model-memory-workbench" / "hardware"
    _write(
        folder,
        "mine",
        {"devices": [{"device": "cuda:0", "memory": "12GB"}, {"device": "cpu", "memory": "32GiB"}]},
    )
    _write(folder, "broken", "{not json")
    profile = load_profile("mine")
    # 12e9 B - (512 MiB + 2 % of 12e9 B = 536870912 + 240000000 B); no margin on RAM
    assert profile.budgets() == {0: 12 * 10**9 - 536870912 - 240000000, "cpu": 32 * GIB}
    assert profile.source == folder / "mine.json"
    assert "mine" in [p.name for p in list_profiles()]  # the broken file is skipped, not fatal
    with pytest.raises(ProfileError, match=r"broken\.json: not valid JSON \(line 1"):
        load_profile(folder / "broken.json")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"devices": []}, "needs a non-empty 'devices' list"),
        ({"devices": [{"device": "cpu"}]}, r"devices\[0\] needs at least 'device' and 'memory'"),
        (
            {"devices": [{"device": "gpu0", "memory": "1GB"}]},
            r"devices\[0\]: 'gpu0' is not a device",
        ),
        (
            {"devices": [{"device": "cpu", "memory": "lots"}]},
            r"devices\[0\]: 'memory': 'lots' is not a memory size",
        ),
        (
            {"devices": [{"device": 0, "memory": 1}, {"device": "cuda:0", "memory": 2}]},
            "lists devices twice: 0",
        ),
        (
            {"disk_read_gbps": 0, "devices": [{"device": "cpu", "memory": "1GiB"}]},
            r": 'disk_read_gbps' must be a number above 0, got 0$",
        ),
        (
            {"host_to_device_gbps": -25, "devices": [{"device": "cpu", "memory": "1GiB"}]},
            r": 'host_to_device_gbps' must be a number above 0, got -25$",
        ),
        (
            {"host_to_device_gbps": "fast", "devices": [{"device": "cpu", "memory": "1GiB"}]},
            r": 'host_to_device_gbps' must be a number above 0, got 'fast'$",
        ),
        (
            {"devices": [{"device": 0, "memory": "24GiB", "compute_tflops": 0}]},
            r", devices\[0\]: 'compute_tflops' must be a number above 0, got 0$",
        ),
        (
            {"devices": [{"device": "cpu", "memory": "8GiB", "memory_bandwidth_gbps": -1}]},
            r", devices\[0\]: 'memory_bandwidth_gbps' must be a number above 0, got -1$",
        ),
        (
            {"devices": [{"device": 0, "memory": "1GiB", "compute_tflops": True}]},
            r", devices\[0\]: 'compute_tflops' must be a number above 0, got True$",
        ),
        (
            {"devices": [{"device": "disk", "memory": "1TB", "memory_bandwidth_gbps": "NaN"}]},
            r", devices\[0\]: 'memory_bandwidth_gbps' must be 0 or more, got 'NaN'$",
        ),
        (
            {"devices": [{"device": 0, "memory": "0GiB"}]},
            r", devices\[0\]: 'memory' must be above 0 bytes, got '0GiB'$",
        ),
        (
            {"devices": [{"device": "cpu", "memory": -4}]},
            r", devices\[0\]: 'memory': -4 is not a memory size: negative",
        ),
        (
            {"devices": [{"device": "cpu", "memory": "8GiB", "free": "some"}]},
            r", devices\[0\]: 'free': 'some' is not a memory size",
        ),
    ],
)
def test_malformed_profiles_name_file_and_problem(tmp_path: Path, data: dict, message: str) -> None:
    path = _write(tmp_path, "bad", data)
    with pytest.raises(ProfileError, match=message) as caught:
        load_profile(path)
    assert str(path) in str(caught.value)


def test_speeds_left_out_get_typical_values_and_a_disk_may_have_no_compute(
    tmp_path: Path,
) -> None:
    path = _write(
        tmp_path,
        "sparse",
        {
            "devices": [
                {"device": 0, "memory": "8GiB"},
                {"device": "cpu", "memory": "8GiB"},
                {"device": "disk", "memory": "1TB", "compute_tflops": 0},
            ]
        },
    )
    profile = load_profile(path)
    assert (profile.device(0).compute_tflops, profile.device(0).memory_bandwidth_gbps) == (
        hardware.GENERIC_GPU_TFLOPS,
        hardware.GENERIC_GPU_BANDWIDTH_GBPS,
    )
    assert profile.device("cpu").compute_tflops == hardware.DEFAULT_CPU_TFLOPS
    assert profile.device("disk").compute_tflops == 0


def test_unknown_profile_lists_known_ones() -> None:
    with pytest.raises(
        ProfileError,
        match=r"unknown hardware profile 'rtx5090'; known profiles: .*detected.*rtx4090-64gb",
    ):
        load_profile("rtx5090")
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile("missing.json")


def test_disk_is_measured_where_offloaded_weights_go(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(hardware.OFFLOAD_DIR_ENV, raising=False)
    assert hardware.default_offload_root() == Path(tempfile.gettempdir())
    assert detect_hardware().device("disk").name == f"disk at {Path(tempfile.gettempdir())}"
    chosen = tmp_path / "offload-here"
    monkeypatch.setenv(hardware.OFFLOAD_DIR_ENV, str(chosen))
    assert hardware.default_offload_root() == chosen
    disk = detect_hardware().device("disk")
    # the folder does not exist yet: its filesystem is measured at the closest existing parent
    assert disk.name == f"disk at {tmp_path}"
    usage = shutil.disk_usage(tmp_path)
    assert disk.memory_bytes == usage.total and 0 < disk.free_bytes <= usage.total
    chosen.mkdir()
    assert detect_hardware().device("disk").name == f"disk at {chosen}"


def test_detected_hardware_matches_this_machine(tmp_path: Path) -> None:
    profile = detect_hardware(offload_folder=tmp_path / "not-yet" / "offload")
    cpu = profile.device("cpu")
    assert cpu.memory_bytes == psutil.virtual_memory().total
    assert 0 < cpu.budget_bytes <= cpu.memory_bytes
    assert profile.device("disk").free_bytes > 0
    assert len(profile.accelerators) == (
        torch.cuda.device_count() if torch.cuda.is_available() else 0
    )
    assert load_profile("detected").name == "detected"


@pytest.mark.gpu
def test_detected_cuda_devices_report_total_and_free(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))  # the link bandwidth cache
    profile = detect_hardware()
    for index in range(torch.cuda.device_count()):
        spec = profile.device(index)
        assert spec.memory_bytes == torch.cuda.get_device_properties(index).total_memory
        assert 0 < spec.free_bytes <= spec.memory_bytes
        assert spec.compute_tflops > 0 and spec.memory_bandwidth_gbps > 0
        # this process's CUDA context alone holds memory; the budget leaves it and the margin
        assert spec.held_bytes == spec.memory_bytes - spec.free_bytes > 0
        assert spec.budget_bytes == spec.free_bytes - spec.safety_margin_bytes
    assert profile.links_measured and profile.host_to_device_gbps > 0
    assert "held" in profile.description and "measured" in profile.description


def test_round_trip_through_dict() -> None:
    profile = load_profile("2x-h100-80gb")
    again = profile_from_dict(profile.to_dict())
    assert again == profile and again.to_dict() == profile.to_dict()
    with pytest.raises(
        ProfileError, match="hardware profile data needs a non-empty 'devices' list"
    ):
        profile_from_dict({"name": "x"})


def test_what_if_profile() -> None:
    base = load_profile("rtx4090-64gb")
    custom = profile_for_budgets({0: 10 * GIB, 1: 10 * GIB, "cpu": 5 * GIB}, base=base)
    assert custom.budgets() == {0: 10 * GIB, 1: 10 * GIB, "cpu": 5 * GIB, "disk": 0}
    assert custom.device(0).compute_tflops == base.device(0).compute_tflops
    assert custom.device(1).name == "GPU 1 (assumed)"
