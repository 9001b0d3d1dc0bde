"""The hardware profile value types: ``DeviceSpec`` (one memory tier) and ``HardwareProfile``.

``workbench.models.hardware`` reads them from JSON files, detects them on this machine and
re-exports them; the JSON format and the budget arithmetic are documented there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.big_modeling.devices import normalize_device
from workbench.big_modeling.planning.sizes import format_nbytes
from workbench.models.device_probe import safety_margin_bytes
from workbench.models.errors import ProfileError
from workbench.models.kernel_costs import DEFAULT_KERNEL_COSTS, KernelCosts
from workbench.models.matmul_probe import MatmulCurve

DETECTED_NAME = "detected"
DEFAULT_HOST_TO_DEVICE_GBPS = 25.0  # PCIe 4.0 x16 with pinned memory
# From pageable RAM the driver stages copies through a pinned bounce buffer: about half the
# pinned rate (NVIDIA, "How to Optimize Data Transfers in CUDA C/C++", 2012: 6 vs 12 GB/s).
PAGEABLE_FRACTION = 0.5
DEFAULT_DISK_READ_GBPS = 2.0  # a mid-range NVMe SSD
DEFAULT_CPU_TFLOPS = 0.5
DEFAULT_CPU_MEMORY_BANDWIDTH_GBPS = 40.0
# The host's cost of an eager forward beyond its arithmetic (``dispatch_probe``): per module
# call (a transformer layer's average per leaf module, its other operations included) and per
# forward (masks, cache, generate's loop). Measured on this machine for the detected profile;
# elsewhere these: this project's 2-core VM measures 13-20 us per module for float32
# transformer layers and 26 us in bfloat16, 0.4 ms per forward; a faster desktop or server
# host dispatches in about half, and on a GPU each call launches at least one kernel (~5 us).
DEFAULT_MODULE_CALL_US = 15.0
DEFAULT_FORWARD_CALL_US = 300.0
# A CPU layer's elementwise work (norms, rotary, activation, residuals) per token, per square
# root of the layer's parameters (``dispatch_probe``): this project's 2-core VM measures
# 1.7-1.9 ns for bfloat16 Llama layers 256 to 2,048 wide (3.2 us a token for SmolLM2-135M's).
DEFAULT_ELEMENTWISE_NS = 1.8
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
        kernel_costs: each precision's decode kernel efficiency per backend
            (``kernel_costs`` module); the documented table unless measured or given.
        module_call_us: the host's microseconds per module call of an eager forward
            (``models.dispatch_probe``): measured for the detected profile, else typical.
        forward_call_us: the host's microseconds per forward outside its modules.
        elementwise_ns: nanoseconds of a CPU layer's elementwise work per token, per square
            root of its parameters (``models.dispatch_probe``; the speed model's prefill).
        dispatch_measured: whether those three were measured on this machine.
        cpu_matmul_curve: this CPU's one-token matmul seconds by weight size and dtype
            (``models.matmul_probe``), measured for the detected profile; ``None``: the CPU's
            memory bandwidth alone.
    """

    name: str
    description: str
    devices: tuple[DeviceSpec, ...]
    host_to_device_gbps: float = DEFAULT_HOST_TO_DEVICE_GBPS
    disk_read_gbps: float = DEFAULT_DISK_READ_GBPS
    source: Path | None = field(default=None, compare=False)
    host_to_device_pageable_gbps: float | None = None
    links_measured: bool = False
    kernel_costs: KernelCosts = field(default=DEFAULT_KERNEL_COSTS, compare=False)
    module_call_us: float = DEFAULT_MODULE_CALL_US
    forward_call_us: float = DEFAULT_FORWARD_CALL_US
    elementwise_ns: float = DEFAULT_ELEMENTWISE_NS
    dispatch_measured: bool = False
    cpu_matmul_curve: MatmulCurve | None = field(default=None, compare=False)

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

    def to_dict(self) -> dict[str, Any]:
        """Return the profile as the JSON data ``load_profile`` reads."""
        links: dict[str, Any] = {}
        if self.host_to_device_pageable_gbps is not None:
            links["host_to_device_pageable_gbps"] = self.host_to_device_pageable_gbps
        if self.links_measured:
            links["links_measured"] = True
        if self.kernel_costs != DEFAULT_KERNEL_COSTS:
            links["kernel_costs"] = self.kernel_costs.to_dict()
        if self.module_call_us != DEFAULT_MODULE_CALL_US:
            links["module_call_us"] = self.module_call_us
        if self.forward_call_us != DEFAULT_FORWARD_CALL_US:
            links["forward_call_us"] = self.forward_call_us
        if self.elementwise_ns != DEFAULT_ELEMENTWISE_NS:
            links["elementwise_ns"] = self.elementwise_ns
        if self.dispatch_measured:
            links["dispatch_measured"] = True
        if self.cpu_matmul_curve is not None:
            links["cpu_matmul_curve"] = asdict(self.cpu_matmul_curve)
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
