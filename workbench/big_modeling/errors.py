"""Errors raised by the engine. Each subclasses a built-in so callers may catch either.

``BadInputError`` marks a problem the user can fix (a file, a map, a budget); the CLI maps it to
exit code 2 and the GUI shows its message as is.
"""

from __future__ import annotations

from collections.abc import Iterable


class BadInputError(ValueError):
    """Input the user can fix: a malformed file, an unknown name, an impossible budget."""


class DeviceMapError(BadInputError):
    """A device map that does not cover the model, names unknown modules or devices, or is malformed."""


class CheckpointError(BadInputError):
    """A checkpoint that is missing, corrupt, truncated, or does not match the model."""


class MemoryBudgetError(BadInputError):
    """Budgets that cannot hold the model (or a no-split block) on any allowed device."""


class OffloadError(OSError):
    """The offload folder cannot be written or read (not writable, disk full, escaped path)."""


class LoadCancelled(Exception):
    """Raised inside a load when its cancel token is set; the load leaves no partial files."""


def not_utf8_text(path: object, data: bytes, error: UnicodeDecodeError) -> str:
    """``"<path>: not UTF-8 text (byte 0xe8 at offset 36)"`` for a failed ``data.decode()``."""
    return f"{path}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start})"


def first_names(names: Iterable[str], limit: int = 20) -> str:
    """``"a, b, c, ... and 7 more"``: the first ``limit`` names of a list in an error message."""
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown}, ... and {len(names) - limit} more"
