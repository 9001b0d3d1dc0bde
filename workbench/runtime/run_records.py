"""Inference and verify runs as records: the figures of one run and the device map it ran
on, with a short id and a summary per map and the lines that differ between two maps.

Plain data, no Qt: the run history table shows these and exports them as JSON.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RunRecord", "map_diff", "map_digest", "map_summary"]


def map_digest(device_map: Mapping[str, int | str]) -> str:
    """Return a short stable id of a device map: 6 hex digits of its sorted JSON's SHA-1."""
    text = json.dumps({str(k): v for k, v in device_map.items()}, sort_keys=True)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:6]


def map_summary(device_map: Mapping[str, int | str]) -> str:
    """Return entries per device: ``"cuda:0 12 · cpu 4 · disk 2"``."""
    counts = Counter(f"cuda:{v}" if isinstance(v, int) else str(v) for v in device_map.values())
    return " · ".join(f"{device} {count}" for device, count in sorted(counts.items()))


def map_diff(first: Mapping[str, int | str], second: Mapping[str, int | str]) -> list[str]:
    """Return one line per module whose device differs, sorted: ``"lm_head: cpu -> disk"``."""
    lines = []
    for name in sorted(set(first) | set(second)):
        a, b = first.get(name, "-"), second.get(name, "-")
        if a != b:
            lines.append(f"{name or '(whole model)'}: {a} -> {b}")
    return lines


@dataclass
class RunRecord:
    """One run. ``kind`` is ``"infer"`` or ``"verify"``; times in seconds.

    ``status``: ``"running"``, ``"done"``, ``"stopped"`` (by the user; the figures are those
    of the tokens streamed before the stop) or ``"failed"``. ``settings`` are the run's
    settings (mode, sampling, system prompt, ...); ``predicted_for`` names the hardware of
    ``predicted`` (``"detected"``: this machine). ``one_forward``: the model generates
    nothing, so the run was one forward: ``ttft_s`` is its time (``predicted["forward_s"]`` the
    prediction) and there is no ``tokens_per_s``.
    """

    run_id: int
    kind: str
    started_at: str
    device_map: dict[str, int | str]
    prompt: str | None = None
    max_new_tokens: int = 0
    text: str = ""
    new_tokens: int = 0
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    total_s: float | None = None
    predicted: dict[str, float] = field(default_factory=dict)
    verify: dict[str, Any] | None = None
    per_layer: list[dict[str, Any]] = field(default_factory=list)
    status: str = "running"
    settings: dict[str, Any] = field(default_factory=dict)
    predicted_for: str = ""
    one_forward: bool = False

    @property
    def map_id(self) -> str:
        return map_digest(self.device_map)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["map_id"] = self.map_id
        return data
