"""Device values are normalised once, where they enter the engine.

A *device value* is what users write in device maps: an ``int`` (accelerator index), a string
(``"cpu"``, ``"cuda:1"``, ``"mps"``, ``"disk"``, ``"meta"``) or a ``torch.device``. The
canonical form keeps transformers' spelling: ``0`` for ``cuda:0``, ``"cpu"``, ``"disk"``,
``"mps"``, ``"meta"``, ``"xpu:1"``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from workbench.big_modeling.errors import DeviceMapError

#: A device as users write it in a device map or a budget: an ``int`` (accelerator index), a
#: string (``"cpu"``, ``"cuda:1"``, ``"disk"``...) or a ``torch.device``; ``normalize_device``
#: turns it into a ``Device``.
DeviceValue = int | str | torch.device
#: A canonical device, what ``normalize_device`` returns and device maps hold once normalised:
#: ``0`` for ``cuda:0``, ``"cpu"``, ``"disk"``, ``"mps"``, ``"meta"``, ``"xpu:1"``.
Device = int | str
#: A device map as a plain dict, once normalised (what ``DeviceMap.to_dict()`` returns).
DeviceDict = dict[str, Device]

# ASCII digits only: str.isdigit() and \d also accept "\u00b2" and "\u0661" (Arabic one).
# At most 9 digits, so int() never meets its 4300-digit limit.
_INDEX = re.compile(r"[0-9]{1,9}", re.ASCII)
_INDEXED = re.compile(r"(cuda|xpu|npu|mlu|hpu)(?::([0-9]{1,9}))?", re.ASCII)
_PLAIN = {"cpu", "disk", "mps", "meta"}


def normalize_device(value: DeviceValue) -> Device:
    """Return the canonical device-map spelling of ``value``.

    ``"cuda:1"``, ``torch.device("cuda", 1)`` and ``1`` all become ``1``; ``"CPU "`` becomes
    ``"cpu"``. Planning never needs the device to exist, so nothing is checked against hardware.

    Raises:
        DeviceMapError: for anything that is not a device (``"gpu0"``, ``-1``, ``True``).
    """
    if isinstance(value, bool):
        raise DeviceMapError(
            f"{value!r} is not a device; use an int index, 'cpu', 'disk' or 'cuda:N'"
        )
    if isinstance(value, int):
        if value < 0:
            raise DeviceMapError(f"device index {value} is negative; use 0, 1, ...")
        return value
    if isinstance(value, torch.device):
        if value.type == "cuda":
            return value.index if value.index is not None else 0
        return value.type if value.index is None else f"{value.type}:{value.index}"
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _PLAIN:
            return text
        if _INDEX.fullmatch(text):
            return int(text)
        match = _INDEXED.fullmatch(text)
        if match:
            kind, index = match.group(1), int(match.group(2) or 0)
            return index if kind == "cuda" else f"{kind}:{index}"
    raise DeviceMapError(
        f"{value!r} is not a device; expected an int index, 'cpu', 'disk', 'mps', 'meta' or 'cuda:N'"
    )


def to_torch_device(value: DeviceValue) -> torch.device:
    """Return the ``torch.device`` for a device value (``0`` -> ``cuda:0``).

    Raises:
        DeviceMapError: for ``"disk"``, which is a storage tier, not a torch device.
    """
    canonical = normalize_device(value)
    if canonical == "disk":
        raise DeviceMapError("'disk' is a storage tier, not an execution device")
    if isinstance(canonical, int):
        return torch.device("cuda", canonical)
    return torch.device(canonical)


def device_label(value: DeviceValue) -> str:
    """Return the name users see: ``"cuda:0"``, ``"cpu"``, ``"disk"``."""
    canonical = normalize_device(value)
    return f"cuda:{canonical}" if isinstance(canonical, int) else canonical


def device_sort_key(value: DeviceValue) -> tuple[int, int, str]:
    """Order devices as the planner fills them: accelerators by index, then mps, cpu, disk."""
    canonical = normalize_device(value)
    if isinstance(canonical, int):
        return (0, canonical, "")
    rank = {"mps": 1, "cpu": 2, "disk": 3, "meta": 4}.get(canonical.split(":")[0], 1)
    return (rank, 0, canonical)


def available_devices() -> list[Device]:
    """The devices this machine can hold weights on now: visible GPUs, mps, cpu, disk.

    Example:
        >>> available_devices()[-2:]
        ['cpu', 'disk']
    """
    found: list[Device] = []
    if torch.cuda.is_available():
        found.extend(range(torch.cuda.device_count()))
    for kind in ("xpu", "npu", "mlu", "hpu"):
        backend = getattr(torch, kind, None)
        is_available = getattr(backend, "is_available", None)
        try:
            if is_available is not None and is_available():
                found.extend(f"{kind}:{i}" for i in range(backend.device_count()))
        except (RuntimeError, AttributeError):  # a backend stub that cannot count devices
            continue
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append("mps")
    return [*found, "cpu", "disk"]


def check_devices_available(
    device_map: Mapping[str, DeviceValue], *, allow_meta: bool = False
) -> None:
    """Check that every device ``device_map`` names exists on this machine, before loading.

    ``"meta"`` is refused unless ``allow_meta``: weights loaded there hold no data, so the model
    cannot run (the engine's loader allows it, as the reference does, to skip modules; the app
    and the CLI refuse it). Planning never calls this (what-if maps for other machines are
    fine); loading does.

    Raises:
        DeviceMapError: naming each key and device this machine lacks (sorted) and the devices
            it has, or a value that is not a device.

    Example:
        >>> check_devices_available({"": "cpu", "lm_head": "disk"})
        >>> check_devices_available({"": "cuda:99"})  # doctest: +SKIP
        Traceback (most recent call last):
        ...
        DeviceMapError: device_map puts 1 module(s) on cuda:99, which this machine does not have: ...
    """
    have = available_devices()
    have_set = set(have) | ({"meta"} if allow_meta else set())
    missing = []
    lacking: dict[str, None] = {}
    for key, value in device_map.items():
        device = normalize_device(value)
        if device not in have_set:
            missing.append(f"{key!r} -> {device_label(device)}")
            lacking[device_label(device)] = None
    if not missing:
        return
    listed = ", ".join(sorted(missing)[:8]) + (
        f" and {len(missing) - 8} more" if len(missing) > 8 else ""
    )
    note = "" if torch.cuda.is_available() else " (no CUDA GPU is visible to torch)"
    if not allow_meta:
        note += "; 'meta' holds no data, so a model there cannot run"
    raise DeviceMapError(
        f"device_map puts {len(missing)} module(s) on {', '.join(sorted(lacking))}, which this "
        f"machine does not have: {listed}. "
        f"This machine has {', '.join(device_label(d) for d in have)}{note}. Edit the map or "
        "plan it again for this machine."
    )
