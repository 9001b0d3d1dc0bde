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
        os.chmod(tmp, _final_mode(final))
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read_umask() -> int:
    # os.umask can only be read by setting it; do that once, at import, not per write.
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


_UMASK = _read_umask()


def _final_mode(final: Path) -> int:
    """Keep an existing file's mode; a new file gets 0o666 less the umask, like ``open()``."""
    try:
        return final.stat().st_mode & 0o7777
    except FileNotFoundError:
        return 0o666 & ~_UMASK


def atomic_write_bytes(target: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``target`` atomically."""
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(target: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``target`` atomically."""
    atomic_write_bytes(target, text.encode("utf-8"))
