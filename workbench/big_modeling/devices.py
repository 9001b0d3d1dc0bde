"""Device values are normalised once, where they enter the engine.

A *device value* is what users write in device maps: an ``int`` (accelerator index), a string
(``"cpu"``, ``"cuda:1"``, ``"mps"``, ``"disk"``, ``"meta"``) or a ``torch.device``. The
canonical form keeps transformers' spelling: ``0`` for ``cuda:0``, ``"cpu"``, ``"disk"``,
``"mps"``, ``"meta"``, ``"xpu:1"``.
"""

from __future__ import annotations

import re

import torch

from workbench.big_modeling.errors import DeviceMapError

DeviceValue = int | str | torch.device

_INDEXED = re.compile(r"^(cuda|xpu|npu|mlu|hpu)(?::(\d+))?$")
_PLAIN = {"cpu", "disk", "mps", "meta"}


def normalize_device(value: DeviceValue) -> int | str:
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
        if text.isdigit():
            return int(text)
        match = _INDEXED.match(text)
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
