"""Hardware the planner plans for: detected on this machine, or a what-if profile.

A profile is a JSON file (``resources/hardware/*.json`` ship with the app; users add their own
under ``$XDG_CONFIG_HOME/model-memory-workbench/hardware/``)::

    {
      "name": "rtx4090-64gb",
      "description": "One 24 GB consumer GPU, 64 GB RAM, NVMe SSD",
      "host_to_device_gbps": 25.0,        # pinned host -> GPU copies, GB/s (PCIe 4.0 x16)
      "host_to_device_pageable_gbps": 12.5,  # optional: from pageable RAM (default: half)
      "disk_read_gbps": 5.0,              # sequential reads from the offload folder, GB/s
      "devices": [
        {"device": 0, "name": "GeForce RTX 4090", "memory": "24GiB",
         "compute_tflops": 165, "memory_bandwidth_gbps": 1008,
         "held": "1GiB", "safety_margin": "1GiB"},   # both optional
        {"device": "cpu", "name": "DDR5", "memory": "64GiB",
         "compute_tflops": 1.0, "memory_bandwidth_gbps": 60},
        {"device": "disk", "name": "NVMe", "memory": "2TB"}
      ]
    }

Memories accept bytes or strings (``"24GiB"``, ``"80GB"``) and must be above 0; bandwidths are
decimal GB/s and compute is dense 16-bit TFLOP/s, both numbers above 0 (a disk may say 0). A
device that leaves its speeds out gets typical values. ``held`` is memory the driver and other
processes already use (detected hardware measures it), ``safety_margin`` overrides the backend's
margin (``device_probe.SAFETY_MARGINS``: CUDA context + allocator fragmentation for GPUs, none for
RAM and disk). A budget is ``memory - held - margin`` (``free - margin`` when detected).

Example:
    >>> profile = load_profile("rtx4090-64gb.json")  # the file above  # doctest: +SKIP
    >>> profile.budgets()  # GPU 0: 24 GiB - 1 GiB held - 1 GiB margin  # doctest: +SKIP
    {0: 23622320128, 'cpu': 68719476736, 'disk': 2000000000000}
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import torch

from workbench.big_modeling.devices import device_sort_key, normalize_device
from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.json_files import read_json
from workbench.big_modeling.planning.sizes import convert_file_size_to_int, format_nbytes
from workbench.models.device_probe import (
    SAFETY_MARGINS,
    gpu_memory_held,
    known_gpu_speed,
    measured_link_bandwidth,
    safety_margin_bytes,
)
from workbench.models.errors import ProfileError
from workbench.resources import resources_root

logger = logging.getLogger(__name__)

DETECTED_NAME = "detected"
DEFAULT_HOST_TO_DEVICE_GBPS = 25.0  # PCIe 4.0 x16 with pinned memory
# From pageable RAM the driver stages copies through a pinned bounce buffer: about half the
# pinned rate (NVIDIA, "How to Optimize Data Transfers in CUDA C/C++", 2012: 6 vs 12 GB/s).
PAGEABLE_FRACTION = 0.5
DEFAULT_DISK_READ_GBPS = 2.0  # a mid-range NVMe SSD
DEFAULT_CPU_TFLOPS = 0.5
DEFAULT_CPU_MEMORY_BANDWIDTH_GBPS = 40.0
GENERIC_GPU_TFLOPS = 100.0  # a GPU whose speed is not known
GENERIC_GPU_BANDWIDTH_GBPS = 1000.0


@dataclass(frozen=True)
class DeviceSpec:
    """One memory tier: an accelerator, the CPU RAM, or the disk.

    Attributes:
        device: canonical device-map value (``0``, ``"cpu"``, ``"disk"``).
        name: what users see ("NVIDIA H200").
        memory_bytes: total capacity.
        free_bytes: free capacity when detected, else ``None`` (a what-if profile).
        compute_tflops: dense 16-bit TFLOP/s (0 for disk). Left at 0 for a CPU or GPU, it
            takes the typical value a profile file without speeds gets.
        memory_bandwidth_gbps: device memory bandwidth, GB/s (0 for disk; typical if 0).
        held_bytes: memory the driver and other processes already hold (detected, or what a
            profile says); ``None``: none known. Already out of ``free_bytes`` when detected.
        margin_bytes: bytes kept out of the budget; ``None``: the backend's
            (``device_probe.SAFETY_MARGINS``).
    """

    device: int | str
    name: str
    memory_bytes: int
    free_bytes: int | None = None
    compute_tflops: float = 0.0
    memory_bandwidth_gbps: float = 0.0
    held_bytes: int | None = None
    margin_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.device == "disk":
            return
        cpu = self.device == "cpu"
        if not self.compute_tflops:
            typical = DEFAULT_CPU_TFLOPS if cpu else GENERIC_GPU_TFLOPS
            object.__setattr__(self, "compute_tflops", typical)
        if not self.memory_bandwidth_gbps:
            typical = DEFAULT_CPU_MEMORY_BANDWIDTH_GBPS if cpu else GENERIC_GPU_BANDWIDTH_GBPS
            object.__setattr__(self, "memory_bandwidth_gbps", typical)

    @property
    def is_accelerator(self) -> bool:
        return self.device not in ("cpu", "disk")

    @property
    def safety_margin_bytes(self) -> int:
        """The margin kept out of the budget (the spec's own, else its backend's)."""
        if self.margin_bytes is not None:
            return self.margin_bytes
        return safety_margin_bytes(self.device, self.memory_bytes)

    @property
    def budget_bytes(self) -> int:
        """What the planner may use: ``free - margin`` when detected, else
        ``memory - held - margin`` (never below 0)."""
        if self.free_bytes is not None:
            available = self.free_bytes
        else:
            available = self.memory_bytes - (self.held_bytes or 0)
        return max(0, available - self.safety_margin_bytes)

    def budget_words(self) -> str:
        """The budget's arithmetic: ``"24 GiB - 1 GiB held - 0.98 GiB margin = 22 GiB"``."""
        parts = [format_nbytes(self.memory_bytes)]
        held = self.held_bytes
        if held is None and self.free_bytes is not None:
            held = self.memory_bytes - self.free_bytes
        if held:
            word = "used" if self.device == "disk" else "held"  # a disk's files, not a process
            parts.append(f"{format_nbytes(held)} {word}")
        if self.safety_margin_bytes:
            parts.append(f"{format_nbytes(self.safety_margin_bytes)} margin")
        if len(parts) == 1:
            return parts[0]
        return f"{' - '.join(parts)} = {format_nbytes(self.budget_bytes)}"


@dataclass(frozen=True)
class HardwareProfile:
    """A machine: its devices and the links between them.

    Attributes:
        name: profile name (file stem, or ``"detected"``).
        description: one line for menus.
        devices: accelerators by index, then cpu, then disk.
        host_to_device_gbps: pinned host RAM -> accelerator copy bandwidth, GB/s.
        disk_read_gbps: offload-folder read bandwidth, GB/s.
        source: the JSON file, or ``None`` for detected hardware.
        host_to_device_pageable_gbps: the same from pageable RAM; ``None``: not known
            (``pageable_gbps`` then assumes ``PAGEABLE_FRACTION`` of the pinned rate).
        links_measured: whether the host-to-device figures were measured on this machine.
    """

    name: str
    description: str
    devices: tuple[DeviceSpec, ...]
    host_to_device_gbps: float = DEFAULT_HOST_TO_DEVICE_GBPS
    disk_read_gbps: float = DEFAULT_DISK_READ_GBPS
    source: Path | None = field(default=None, compare=False)
    host_to_device_pageable_gbps: float | None = None
    links_measured: bool = False

    @property
    def pageable_gbps(self) -> float:
        """Host-to-device GB/s from pageable RAM: measured or given, else half the pinned."""
        if self.host_to_device_pageable_gbps is not None:
            return self.host_to_device_pageable_gbps
        return self.host_to_device_gbps * PAGEABLE_FRACTION

    def budget_description(self) -> str:
        """How the budgets are made, one clause per device that has a deduction:
        ``"budgets: cuda:0 24 GiB - 0.98 GiB margin = 23 GiB"`` (or ``"budgets: full memory"``)."""
        clauses = [
            f"{_device_words(spec.device)} {spec.budget_words()}"
            for spec in self.devices
            if spec.budget_bytes != spec.memory_bytes
        ]
        return f"budgets: {'; '.join(clauses)}" if clauses else "budgets: full memory"

    def budgets(self) -> dict[int | str, int]:
        """Return ``{device: budget_bytes}`` for ``max_memory`` (GPUs, then cpu, then disk)."""
        return {spec.device: spec.budget_bytes for spec in self.devices}

    def device(self, device: int | str) -> DeviceSpec:
        """Return the spec of one device.

        Raises:
            ProfileError: when the profile has no such device (lists the ones it has).
        """
        wanted = normalize_device(device)
        for spec in self.devices:
            if spec.device == wanted:
                return spec
        have = ", ".join(str(spec.device) for spec in self.devices)
        raise ProfileError(
            f"hardware profile {self.name!r} has no device {wanted!r}; it has {have}"
        )

    def has_device(self, device: int | str) -> bool:
        wanted = normalize_device(device)
        return any(spec.device == wanted for spec in self.devices)

    @property
    def accelerators(self) -> tuple[DeviceSpec, ...]:
        return tuple(spec for spec in self.devices if spec.is_accelerator)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareProfile:
        """Rebuild a profile from ``to_dict`` data (raises ``ProfileError`` when malformed)."""
        return profile_from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """Return the profile as the JSON data ``load_profile`` reads."""
        links: dict[str, Any] = {}
        if self.host_to_device_pageable_gbps is not None:
            links["host_to_device_pageable_gbps"] = self.host_to_device_pageable_gbps
        if self.links_measured:
            links["links_measured"] = True
        return {
            "name": self.name,
            "description": self.description,
            "host_to_device_gbps": self.host_to_device_gbps,
            **links,
            "disk_read_gbps": self.disk_read_gbps,
            "devices": [_device_to_dict(spec) for spec in self.devices],
        }


def _device_to_dict(spec: DeviceSpec) -> dict[str, Any]:
    optional = {
        "free": spec.free_bytes,
        "held": spec.held_bytes,
        "safety_margin": spec.margin_bytes,
    }
    return {
        "device": spec.device,
        "name": spec.name,
        "memory": spec.memory_bytes,
        **{key: value for key, value in optional.items() if value is not None},
        "compute_tflops": spec.compute_tflops,
        "memory_bandwidth_gbps": spec.memory_bandwidth_gbps,
    }


def _device_words(device: int | str) -> str:
    return f"cuda:{device}" if isinstance(device, int) else str(device)


def user_config_dir(kind: str) -> Path:
    """Return ``$XDG_CONFIG_HOME/model-memory-workbench/<kind>``, the folder for the user's own
    profiles of one kind (``"hardware"``, ``"clusters"``); it may not exist."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "model-memory-workbench" / kind


def user_profiles_dir() -> Path:
    """Return the folder for the user's own hardware profiles (it may not exist)."""
    return user_config_dir("hardware")


def bundled_profiles_dir() -> Path:
    return resources_root() / "hardware"


def list_profiles(*, include_detected: bool = False) -> list[HardwareProfile]:
    """Return the bundled profiles, then the user's (a user file overrides a bundled name).

    A malformed user file is skipped with a warning in the log, so one bad file does not hide
    the others; ``load_profile`` on it raises the full error.
    """
    found: dict[str, HardwareProfile] = {}
    for folder in (bundled_profiles_dir(), user_profiles_dir()):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.json")):
            try:
                profile = _read_profile(path)
            except ProfileError as exc:
                logger.warning("skipping hardware profile %s: %s", path, exc)
                continue
            found[profile.name] = profile
    profiles = list(found.values())
    if include_detected:
        profiles.insert(0, detect_hardware())
    return profiles


def load_profile(name_or_path: str | os.PathLike[str]) -> HardwareProfile:
    """Return a profile by name (bundled or user), by JSON path, or ``"detected"``.

    Raises:
        ProfileError: unknown name (lists the known ones) or a malformed file.

    Example:
        >>> load_profile("cpu-laptop-16gb").budgets()["cpu"]  # doctest: +SKIP
        17179869184
    """
    text = os.fspath(name_or_path)
    if text in (DETECTED_NAME, "local"):
        return detect_hardware()
    path = Path(text)
    if text.endswith(".json") or path.is_file():
        if not path.is_file():
            raise ProfileError(f"hardware profile file {text!r} does not exist")
        return _read_profile(path)
    profiles = {profile.name: profile for profile in list_profiles()}
    if text in profiles:
        return profiles[text]
    known = ", ".join(sorted([*profiles, DETECTED_NAME]))
    raise ProfileError(
        f"unknown hardware profile {text!r}; known profiles: {known} (or give a .json path)"
    )


OFFLOAD_DIR_ENV = "WORKBENCH_OFFLOAD_DIR"


def default_offload_root() -> Path:
    """The folder offloaded weights go under: ``$WORKBENCH_OFFLOAD_DIR`` when set, else the
    system temp folder (``tempfile.gettempdir()``), which is where loading makes its offload
    folders; disk budgets are measured here."""
    explicit = os.environ.get(OFFLOAD_DIR_ENV)
    return Path(explicit).expanduser() if explicit else Path(tempfile.gettempdir())


def detect_hardware(
    offload_folder: str | os.PathLike[str] | None = None, *, measure_links: bool = True
) -> HardwareProfile:
    """Describe this machine: each CUDA device (total, held by the driver and other processes,
    free), CPU RAM, and the free disk where ``offload_folder`` (default:
    ``default_offload_root()``) lives; the disk's name says which path was measured.

    With a GPU and ``measure_links``, the host-to-device bandwidth (pinned and pageable) is
    measured once per device and cached (``device_probe.cached_link_bandwidth``); compute and
    memory bandwidths are known values for the GPU's name. Budgets are ``free - margin``.
    """
    devices: list[DeviceSpec] = []
    links = None
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            total_bytes, held_bytes = gpu_memory_held(index)
            tflops, bandwidth = known_gpu_speed(props.name) or (
                GENERIC_GPU_TFLOPS,
                GENERIC_GPU_BANDWIDTH_GBPS,
            )
            devices.append(
                DeviceSpec(
                    index,
                    props.name,
                    total_bytes,
                    total_bytes - held_bytes,
                    tflops,
                    bandwidth,
                    held_bytes=held_bytes,
                )
            )
        if measure_links and devices:
            links = measured_link_bandwidth(len(devices))
    ram = psutil.virtual_memory()
    devices.append(
        DeviceSpec(
            "cpu",
            f"RAM ({psutil.cpu_count(logical=False) or psutil.cpu_count()} cores)",
            int(ram.total),
            int(ram.available),
            DEFAULT_CPU_TFLOPS,
            DEFAULT_CPU_MEMORY_BANDWIDTH_GBPS,
        )
    )
    disk_at = Path(offload_folder) if offload_folder is not None else default_offload_root()
    disk_at = disk_at.expanduser().absolute()
    while not disk_at.exists() and disk_at != disk_at.parent:
        disk_at = disk_at.parent  # measure the filesystem the folder will be created on
    usage = shutil.disk_usage(disk_at)
    devices.append(DeviceSpec("disk", f"disk at {disk_at}", int(usage.total), int(usage.free)))
    profile = HardwareProfile(name=DETECTED_NAME, description="", devices=tuple(devices))
    if links is not None:
        profile = replace(
            profile,
            host_to_device_gbps=links.pinned_gbps,
            host_to_device_pageable_gbps=links.pageable_gbps,
            links_measured=True,
        )
    measured = (
        f"host->device measured {links.pinned_gbps:.3g} GB/s pinned, "
        f"{links.pageable_gbps:.3g} pageable"
        if links is not None
        else "link bandwidths are typical values"
    )
    notes = [measured, profile.budget_description()]
    if profile.accelerators:
        notes.append(f"GPU margin: {SAFETY_MARGINS['cuda'].why}")
    return replace(profile, description=f"this machine (detected; {'; '.join(notes)})")


def _read_profile(path: Path) -> HardwareProfile:
    try:
        data = read_json(
            path,
            what="a hardware profile (a JSON object with a 'devices' list)",
            fix="Fix or delete the file; see `workbench profiles --json` for the format.",
            error=ProfileError,
            max_nbytes=2**20,  # a profile lists a few devices: 1 MiB is generous
        )
    except FileNotFoundError:  # listed by glob, then gone, or a link to nothing
        raise ProfileError(
            f"hardware profile {path}: does not exist (deleted, or a link to nothing)"
        ) from None
    return profile_from_dict(data, source=path)


def profile_from_dict(data: Any, *, source: Path | None = None) -> HardwareProfile:
    """Build a profile from JSON data (what ``HardwareProfile.to_dict`` writes).

    Memories must be above 0 bytes, bandwidths and compute above 0 (a disk has neither compute
    nor memory bandwidth, so 0 is allowed there). A device without speeds gets typical values.

    Raises:
        ProfileError: naming the file (or "hardware profile data"), the device, the field and
            the problem.
    """
    where_file = f"hardware profile {source}" if source else "hardware profile data"
    if not isinstance(data, dict):
        raise ProfileError(f"{where_file} must hold a JSON object")
    raw_devices = data.get("devices")
    if not isinstance(raw_devices, list) or not raw_devices:
        raise ProfileError(f"{where_file} needs a non-empty 'devices' list")
    devices = [
        _device_from_dict(raw, f"{where_file}, devices[{i}]") for i, raw in enumerate(raw_devices)
    ]
    seen = [spec.device for spec in devices]
    duplicates = sorted({str(d) for d in seen if seen.count(d) > 1})
    if duplicates:
        raise ProfileError(f"{where_file} lists devices twice: {', '.join(duplicates)}")
    devices.sort(key=lambda spec: device_sort_key(spec.device))
    return HardwareProfile(
        name=str(data.get("name") or (source.stem if source else "custom")),
        description=str(data.get("description", "")),
        devices=tuple(devices),
        host_to_device_gbps=_positive(
            data, "host_to_device_gbps", DEFAULT_HOST_TO_DEVICE_GBPS, where_file
        ),
        disk_read_gbps=_positive(data, "disk_read_gbps", DEFAULT_DISK_READ_GBPS, where_file),
        source=source,
        host_to_device_pageable_gbps=(
            _positive(data, "host_to_device_pageable_gbps", 0.0, where_file)
            if data.get("host_to_device_pageable_gbps") is not None
            else None
        ),
        links_measured=data.get("links_measured") is True,
    )


def _device_from_dict(raw: Any, where: str) -> DeviceSpec:
    if not isinstance(raw, dict) or "device" not in raw or "memory" not in raw:
        raise ProfileError(f"{where} needs at least 'device' and 'memory'")
    try:
        device = normalize_device(raw["device"])
    except BadInputError as exc:
        raise ProfileError(f"{where}: {exc}") from exc
    memory_bytes = profile_size(raw, "memory", where)
    if memory_bytes == 0:
        raise ProfileError(f"{where}: 'memory' must be above 0 bytes, got {raw['memory']!r}")
    free_bytes, held_bytes, margin_bytes = (
        profile_size(raw, key, where) if raw.get(key) is not None else None
        for key in ("free", "held", "safety_margin")
    )
    if held_bytes is not None and held_bytes > memory_bytes:
        raise ProfileError(
            f"{where}: 'held' ({format_nbytes(held_bytes)}) is more than 'memory' "
            f"({format_nbytes(memory_bytes)}); give the memory other processes hold"
        )
    # left out (0.0), a CPU's or GPU's speeds take typical values in ``DeviceSpec``
    disk = device == "disk"
    tflops = _positive(raw, "compute_tflops", 0.0, where, allow_zero=disk)
    bandwidth = _positive(raw, "memory_bandwidth_gbps", 0.0, where, allow_zero=disk)
    return DeviceSpec(
        device=device,
        name=str(raw.get("name", device)),
        memory_bytes=memory_bytes,
        free_bytes=free_bytes,
        compute_tflops=tflops,
        memory_bandwidth_gbps=bandwidth,
        held_bytes=held_bytes,
        margin_bytes=margin_bytes,
    )


def profile_size(raw: dict[str, Any], key: str, where: str) -> int:
    """``raw[key]`` through the one size parser; a bad value is a ``ProfileError`` at ``where``."""
    try:
        return convert_file_size_to_int(raw[key])
    except (BadInputError, TypeError, ValueError) as exc:
        raise ProfileError(f"{where}: '{key}': {exc}") from exc


def _positive(
    data: dict[str, Any], key: str, default: float, where: str, *, allow_zero: bool = False
) -> float:
    """``data[key]`` as a finite number above 0 (or 0 with ``allow_zero``); ``default`` if absent."""
    value = data.get(key)
    if value is None:
        return default
    number = None
    if not isinstance(value, bool):
        with contextlib.suppress(TypeError, ValueError):
            number = float(value)
    lowest = "0 or more" if allow_zero else "a number above 0"
    if number is None or not math.isfinite(number):
        raise ProfileError(f"{where}: '{key}' must be {lowest}, got {value!r}")
    if number < 0 or (number == 0 and not allow_zero):
        raise ProfileError(f"{where}: '{key}' must be {lowest}, got {value!r}")
    return number


def profile_for_budgets(
    budgets: dict[int | str, int], base: HardwareProfile | None = None
) -> HardwareProfile:
    """Return a profile with exactly the devices and memories of ``budgets``.

    Speeds come from ``base`` where it has the device, else from typical values (a generic
    100 TFLOP/s, 1000 GB/s GPU; the default CPU). Used to predict speed for ``--max-memory``
    plans on hardware this machine does not have.
    """
    devices = []
    for device, nbytes in budgets.items():
        canonical = normalize_device(device)
        if base is not None and base.has_device(canonical):
            spec = replace(
                base.device(canonical),
                memory_bytes=int(nbytes),
                free_bytes=None,
                held_bytes=None,
                margin_bytes=0,  # the budgets given are what the plan may use, nothing less
            )
        elif isinstance(canonical, int):
            spec = DeviceSpec(
                canonical,
                f"GPU {canonical} (assumed)",
                int(nbytes),
                None,
                GENERIC_GPU_TFLOPS,
                GENERIC_GPU_BANDWIDTH_GBPS,
                margin_bytes=0,
            )
        elif canonical == "disk":
            spec = DeviceSpec("disk", "disk (assumed)", int(nbytes))
        else:
            spec = DeviceSpec(
                canonical,
                f"{canonical} (assumed)",
                int(nbytes),
                None,
                DEFAULT_CPU_TFLOPS,
                DEFAULT_CPU_MEMORY_BANDWIDTH_GBPS,
            )
        devices.append(spec)
    if not any(spec.device == "disk" for spec in devices):
        devices.append(DeviceSpec("disk", "disk (assumed)", 0))
    devices.sort(key=lambda spec: device_sort_key(spec.device))
    return HardwareProfile(
        name=base.name if base is not None else "custom",
        description=base.description if base is not None else "budgets from --max-memory",
        devices=tuple(devices),
        host_to_device_gbps=base.host_to_device_gbps if base else DEFAULT_HOST_TO_DEVICE_GBPS,
        disk_read_gbps=base.disk_read_gbps if base else DEFAULT_DISK_READ_GBPS,
        source=base.source if base else None,
        host_to_device_pageable_gbps=base.host_to_device_pageable_gbps if base else None,
        links_measured=base.links_measured if base else False,
    )
