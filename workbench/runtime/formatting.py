"""How the GUI and the CLI write sizes, counts, times and speeds: binary units for bytes, B/M
for parameters, decimal units for bandwidth (GB/s = 1e9 bytes/s), never scientific notation."""

from __future__ import annotations

import math

from workbench.runtime.engine import format_nbytes, format_param_count
from workbench.wording import plural, with_article

__all__ = [
    "format_bandwidth",
    "format_nbytes",
    "format_param_count",
    "format_rate",
    "format_seconds",
    "format_ttft",
]


def format_seconds(seconds: float) -> str:
    """Return a duration: ``"< 0.1 ms"``, ``"0.4 ms"``, ``"12 ms"``, ``"2.5 s"``, ``"340 s"``.

    Below 10 ms one decimal is kept, so a sub-millisecond time never reads as ``"0 ms"``.
    """
    if not math.isfinite(seconds):  # NaN or inf: nothing meaningful to show
        return "-"
    if seconds <= 0:
        return "0 ms"
    if seconds < 1e-4:
        return "< 0.1 ms"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:.0f} s"


def format_rate(tokens_per_s: float) -> str:
    """Return a decode rate with three significant digits and no exponent.

    Example:
        >>> format_rate(7731.2), format_rate(35.24), format_rate(0.06149)
        ('7,730 tok/s', '35.2 tok/s', '0.0615 tok/s')
    """
    if not math.isfinite(tokens_per_s):
        return "-"
    return f"{_plain(tokens_per_s)} tok/s"


def format_ttft(seconds: float, prompt_tokens: int | None) -> str:
    """Return a time to first token with the prompt length it is for, when known.

    Example:
        >>> format_ttft(0.0021, 128), format_ttft(0.0021, 8)
        ('2.1 ms for a 128-token prompt', '2.1 ms for an 8-token prompt')
    """
    text = format_seconds(seconds)
    if prompt_tokens is None or prompt_tokens <= 0:
        return text
    return f"{text} for {with_article(f'{prompt_tokens}-token prompt')}"


def format_forward(seconds: float, tokens: int | None = None) -> str:
    """Return the time of one forward (a model that generates nothing), with its input length
    when known.

    Example:
        >>> format_forward(0.0081, 128), format_forward(0.03, 1), format_forward(0.03)
        ('one forward over 128 tokens in 8.1 ms', 'one forward over 1 token in 30 ms', 'one forward in 30 ms')
    """
    over = f" over {plural(tokens, 'token')}" if tokens else ""
    return f"one forward{over} in {format_seconds(seconds)}"


def format_bandwidth(bytes_per_s: float) -> str:
    """Return a transfer rate in decimal units: ``"12.4 GB/s"``, ``"0.85 GB/s"``, ``"1.8 MB/s"``.

    Small transfers keep a readable figure instead of ``"0.00 GB/s"``; ``"-"`` when unknown.
    """
    if not math.isfinite(bytes_per_s) or bytes_per_s <= 0:
        return "-"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= scale / 10:  # 0.8 GB/s, as the GB/s axes read; 1.8 MB/s, not 0.0018
            return f"{_plain(bytes_per_s / scale)} {unit}"
    return f"{bytes_per_s:.0f} B/s"


def _plain(value: float) -> str:
    """Three significant digits (trailing zeros dropped), thousands separated, no exponent."""
    rounded = float(f"{value:.3g}")  # round first: 9.996 becomes 10.0, not 10.00
    if rounded == 0:
        return "0"
    if abs(rounded) >= 100:
        return f"{rounded:,.0f}"
    decimals = 2 - math.floor(math.log10(abs(rounded)))
    return f"{rounded:.{decimals}f}".rstrip("0").rstrip(".")  # as "g" does: 3.5, not 3.50


PAGED_IN_NOTE_BYTES = 2**20
"""File-backed bytes a run must page in before ``paged_in_words`` says so."""


def paged_in_words(nbytes: int, *, one_forward: bool = False) -> str:
    """What a run's ``paged_in_bytes`` cost it, in words ("" below ``PAGED_IN_NOTE_BYTES``);
    ``one_forward``: a run that generated nothing (its figure is the forward's time).

    Example:
        >>> paged_in_words(257 * 2**20)
        'this run paged in 257 MiB of memory-mapped weights on first use (in its time to first token; not in the prediction)'
    """
    if nbytes < PAGED_IN_NOTE_BYTES:
        return ""
    figure = "its forward's time" if one_forward else "its time to first token"
    return (
        f"this run paged in {format_nbytes(nbytes)} of memory-mapped weights on first use "
        f"(in {figure}; not in the prediction)"
    )
