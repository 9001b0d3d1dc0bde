"""How the GUI writes sizes, counts and times: binary units for bytes, B/M for parameters."""

from __future__ import annotations

import math

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(nbytes: float) -> str:
    """Return ``nbytes`` in binary units with the unit always shown: ``"1.5 GiB"``."""
    value = float(nbytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in _BYTE_UNITS:
        if value < 1024 or unit == _BYTE_UNITS[-1]:
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.3g} {unit}" if value < 100 else f"{sign}{value:.0f} {unit}"
        value /= 1024
    return f"{sign}{value:.0f} PiB"  # pragma: no cover - loop always returns


def format_params(count: int) -> str:
    """Return a parameter count as ``"70.6B"``, ``"1.05B"``, ``"12.3M"``, ``"4.1K"``."""
    for threshold, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= threshold:
            return f"{count / threshold:.3g}{suffix}"
    return str(int(count))


def format_seconds(seconds: float) -> str:
    """Return a duration in ms below one second, else in s."""
    if not math.isfinite(seconds):  # NaN or inf: nothing meaningful to show
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:.0f} s"


def format_rate(tokens_per_s: float) -> str:
    """Return a decode rate: ``"0.41 tok/s"``, ``"35.2 tok/s"``."""
    if math.isnan(tokens_per_s):
        return "-"
    return f"{tokens_per_s:.3g} tok/s"
