"""Atomic file writes: write to a temporary file in the target's folder, fsync, then rename.

A crash, a full disk or an exception never leaves a half-written file under the real name.
Every export in the project (device maps, sessions, CSV, shards) goes through here.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success it replaces ``target``.

    Example:
        >>> with atomic_path("map.json") as tmp:  # doctest: +SKIP
        ...     tmp.write_text("{}")
    """
    final = Path(target)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(target: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``target`` atomically."""
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(target: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``target`` atomically."""
    atomic_write_bytes(target, text.encode("utf-8"))
