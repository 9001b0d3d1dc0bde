"""Memory sizes as users write them in profiles and on the command line."""

from __future__ import annotations

import re

from workbench.big_modeling.errors import BadInputError

__all__ = ["parse_bytes"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}


def parse_bytes(value: int | float | str) -> int:
    """Return bytes for ``24GiB``, ``80GB``, ``500MB``, ``1.5TiB`` or a plain number.

    Raises:
        BadInputError: for anything else, with the accepted spellings.
    """
    if isinstance(value, bool):
        raise BadInputError(f"{value!r} is not a size")
    if isinstance(value, int | float):
        if value < 0:
            raise BadInputError(f"size {value} is negative")
        return int(value)
    match = _SIZE.match(str(value))
    if not match:
        raise BadInputError(
            f"{value!r} is not a size; write bytes or a number with a unit: 24GiB, 80GB, 500MB"
        )
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    prefix = unit[:1] if unit[:1] != "B" else ""
    factor = 1024 ** ("KMGTP".index(prefix) + 1) if "I" in unit else _UNITS[prefix]
    return int(number * factor)
