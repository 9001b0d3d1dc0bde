"""How the GUI writes sizes, counts and times: binary units for bytes, B/M for parameters."""

from __future__ import annotations

import math

from workbench.big_modeling.sizes import format_nbytes, format_param_count

__all__ = ["format_nbytes", "format_param_count", "format_rate", "format_seconds"]


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
