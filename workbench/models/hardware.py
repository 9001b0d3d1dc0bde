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
An optional ``"kernel_costs": {"cpu": {"int8": 0.26, ...}, "cuda": {...}}`` gives each
precision's decode kernel efficiency (``kernel_costs`` module; the documented table otherwise).
Optional ``"module_call_us"`` and ``"forward_call_us"`` give the host's cost of an eager forward
beyond its arithmetic, per module call and per forward (``dispatch_probe``; typical values
``DEFAULT_MODULE_CALL_US`` and ``DEFAULT_FORWARD_CALL_US`` otherwise, measured when detected),
and ``"elementwise_ns"`` a CPU layer's elementwise work per token per square root of its
parameters (``DEFAULT_ELEMENTWISE_NS`` otherwise).

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
from dataclasses import replace
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
    CpuKernelProbe,
    cached_cpu_kernels,
    gpu_memory_held,
    known_gpu_speed,
    measured_link_bandwidth,
)
from workbench.models.dispatch_probe import DispatchOverhead, cached_dispatch_overhead
from workbench.models.errors import ProfileError
from workbench.models.hardware_profile import (
    DEFAULT_CPU_MEMORY_BANDWIDTH_GBPS,
    DEFAULT_CPU_TFLOPS,
    DEFAULT_DISK_READ_GBPS,
    DEFAULT_ELEMENTWISE_NS,
    DEFAULT_FORWARD_CALL_US,
    DEFAULT_HOST_TO_DEVICE_GBPS,
    DEFAULT_MODULE_CALL_US,
    DETECTED_NAME,
    GENERIC_GPU_BANDWIDTH_GBPS,
    GENERIC_GPU_TFLOPS,
    DeviceSpec,
    HardwareProfile,
)
from workbench.models.kernel_costs import (
    DEFAULT_KERNEL_COSTS,
    MEMORY_BANDWIDTH_UTILIZATION,
    KernelCosts,
)
from workbench.models.matmul_probe import MatmulCurve, cached_matmul_curve
from workbench.resources import resources_root

logger = logging.getLogger(__name__)


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
    offload_folder: str | os.PathLike[str] | None = None,
    *,
    measure_links: bool = True,
    measure_kernels: bool = False,
    measure_host_probes: bool = False,
) -> HardwareProfile:
    """Describe this machine: each CUDA device (total, held by the driver and other processes,
    free), CPU RAM, and the free disk where ``offload_folder`` (default:
    ``default_offload_root()``) lives; the disk's name says which path was measured.

    With a GPU and ``measure_links``, the host-to-device bandwidth (pinned and pageable) is
    measured once per device and cached (``device_probe.cached_link_bandwidth``); compute and
    memory bandwidths are known values for the GPU's name. Budgets are ``free - margin``.
    The CPU's kernel costs and memory bandwidth come from the cached CPU kernel probe
    (``device_probe.cached_cpu_kernels``), measured now only with ``measure_kernels`` (it
    needs torchao); without one they are the documented and typical values. The host's
    dispatch cost per module call and per forward comes from the cached dispatch probe
    (``dispatch_probe.cached_dispatch_overhead``), measured when missing with
    ``measure_host_probes``, and so does the CPU's matmul curve (``matmul_probe``: seconds by
    weight size); both run in fresh processes, about 6 s once per machine
    (``with_host_probes``).
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
    kernels = cached_cpu_kernels(measure_if_missing=measure_kernels)
    if kernels is not None:
        profile = with_cpu_kernels(profile, kernels)
        measured += (
            f"; CPU kernels measured (bf16 decode {kernels.bf16_gbps:.3g} GB/s, "
            + ", ".join(f"{k} {v:.2g}x" for k, v in kernels.efficiency.items() if k != "plain")
            + " of its bandwidth)"
        )
    profile = with_host_probes(profile, measure=measure_host_probes)
    if profile.cpu_matmul_curve is not None:
        measured += "; CPU matmuls timed by weight size"
    if profile.dispatch_measured:
        measured += (
            f"; dispatch measured ({profile.module_call_us:.3g} us per module call, "
            f"{profile.forward_call_us / 1e3:.2g} ms per forward)"
        )
    notes = [measured, profile.budget_description()]
    if profile.accelerators:
        notes.append(f"GPU margin: {SAFETY_MARGINS['cuda'].why}")
    return replace(profile, description=f"this machine (detected; {'; '.join(notes)})")


def with_host_probes(profile: HardwareProfile, *, measure: bool = True) -> HardwareProfile:
    """``profile`` (this machine's) with the host's measured dispatch costs and the CPU's
    matmul curve, from their caches, measured now where missing when ``measure`` (each in a
    fresh process: 2 to 5 s the first time on a machine; a failure leaves typical values)."""
    if profile.cpu_matmul_curve is None:
        curve = cached_matmul_curve(measure_if_missing=measure)
        if curve is not None:
            profile = replace(profile, cpu_matmul_curve=curve)
    if not profile.dispatch_measured:
        dispatch = cached_dispatch_overhead(measure_if_missing=measure)
        if dispatch is not None:
            profile = with_dispatch_overhead(profile, dispatch)
    return profile


def with_cached_probes(profile: HardwareProfile) -> HardwareProfile:
    """``profile`` (this machine's) with the figures of every probe this machine has cached,
    nothing measured: the host probes (dispatch costs, the CPU's matmul curve) and the CPU's
    kernel costs, which a run's worker and the precision planner measure when missing. A
    cached figure replaces the profile's own, so a profile made before a probe was measured
    again (a restored session's) takes the newest, as the worker's prediction does. The same
    object when nothing differs."""
    updated = profile
    curve = cached_matmul_curve(measure_if_missing=False)
    if curve is not None:
        updated = replace(updated, cpu_matmul_curve=curve)
    dispatch = cached_dispatch_overhead(measure_if_missing=False)
    if dispatch is not None:
        updated = with_dispatch_overhead(updated, dispatch)
    kernels = cached_cpu_kernels(measure_if_missing=False)
    if kernels is not None:
        updated = with_cpu_kernels(updated, kernels)
    return profile if updated == profile else updated


def with_host_measurements(profile: HardwareProfile, measured: Any) -> HardwareProfile:
    """``profile`` (this machine's) with freshly measured host probes (a
    ``host_measurements.HostMeasurements``; a probe that failed leaves the profile's figure)."""
    if measured.matmul_curve is not None:
        profile = replace(profile, cpu_matmul_curve=measured.matmul_curve)
    if measured.dispatch is not None:
        profile = with_dispatch_overhead(profile, measured.dispatch)
    if measured.cpu_kernels is not None:
        profile = with_cpu_kernels(profile, measured.cpu_kernels)
    return profile


def host_probes_applied(profile: HardwareProfile) -> bool:
    """Whether ``profile`` carries both host probes (``with_host_probes`` has nothing to add)."""
    return profile.cpu_matmul_curve is not None and profile.dispatch_measured


def with_dispatch_overhead(profile: HardwareProfile, probe: DispatchOverhead) -> HardwareProfile:
    """``profile`` with this machine's measured host dispatch costs (``dispatch_probe``)."""
    return replace(
        profile,
        module_call_us=probe.per_module_s * 1e6,
        forward_call_us=probe.step_s * 1e6,
        elementwise_ns=probe.elementwise_s * 1e9,
        dispatch_measured=True,
    )


def with_cpu_kernels(profile: HardwareProfile, probe: CpuKernelProbe) -> HardwareProfile:
    """``profile`` with this CPU's measured kernel costs, and a CPU memory bandwidth at which
    the speed model's 16-bit read (``MEMORY_BANDWIDTH_UTILIZATION`` of it) is the measured bf16
    decode rate."""
    costs = KernelCosts(
        {**profile.kernel_costs.cpu, **probe.efficiency}, profile.kernel_costs.cuda, True
    )
    devices = tuple(
        replace(spec, memory_bandwidth_gbps=probe.bf16_gbps / MEMORY_BANDWIDTH_UTILIZATION)
        if spec.device == "cpu"
        else spec
        for spec in profile.devices
    )
    return replace(profile, devices=devices, kernel_costs=costs)


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
        kernel_costs=_kernel_costs(data, where_file),
        module_call_us=_positive(
            data, "module_call_us", DEFAULT_MODULE_CALL_US, where_file, allow_zero=True
        ),
        forward_call_us=_positive(
            data, "forward_call_us", DEFAULT_FORWARD_CALL_US, where_file, allow_zero=True
        ),
        elementwise_ns=_positive(
            data, "elementwise_ns", DEFAULT_ELEMENTWISE_NS, where_file, allow_zero=True
        ),
        dispatch_measured=data.get("dispatch_measured") is True,
        cpu_matmul_curve=_matmul_curve(data, where_file),
    )


def _matmul_curve(data: dict[str, Any], where: str) -> MatmulCurve | None:
    raw = data.get("cpu_matmul_curve")
    if raw is None:
        return None
    try:
        curve = MatmulCurve(**raw)
        valid = all(
            len(point) == 2 and point[0] > 0 and point[1] >= 0
            for points in curve.points.values()
            for point in points
        )
    except (TypeError, AttributeError) as exc:
        raise ProfileError(f"{where}: 'cpu_matmul_curve': {exc}") from exc
    if not valid:
        raise ProfileError(
            f"{where}: 'cpu_matmul_curve' points must be [bytes above 0, seconds 0 or more]"
        )
    return curve


def _kernel_costs(data: dict[str, Any], where: str) -> KernelCosts:
    raw = data.get("kernel_costs")
    if raw is None:
        return DEFAULT_KERNEL_COSTS
    try:
        return KernelCosts.from_dict(raw)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ProfileError(f"{where}: 'kernel_costs': {exc}") from exc


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
        kernel_costs=base.kernel_costs if base else DEFAULT_KERNEL_COSTS,
        module_call_us=base.module_call_us if base else DEFAULT_MODULE_CALL_US,
        forward_call_us=base.forward_call_us if base else DEFAULT_FORWARD_CALL_US,
        elementwise_ns=base.elementwise_ns if base else DEFAULT_ELEMENTWISE_NS,
        dispatch_measured=base.dispatch_measured if base else False,
        cpu_matmul_curve=base.cpu_matmul_curve if base else None,
    )
