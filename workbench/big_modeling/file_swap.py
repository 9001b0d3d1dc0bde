"""Replace files so that a failure before the commit point puts every old file back.

Used by the offload folder writers: data files are swapped in first, ``index.json`` lands last;
until it has, each replaced file is kept under a hidden name and restored when anything fails.

Example:
    >>> from pathlib import Path
    >>> set_aside(Path("/nonexistent/file")) is None  # nothing there to keep
    True
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)


def set_aside(final: Path) -> Path | None:
    """Keep the file now at ``final`` under a hidden name; None when there is none."""
    if not os.path.lexists(final):
        return None
    aside = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.old")
    try:
        os.link(final, aside, follow_symlinks=False)  # no window in which ``final`` is missing
    except OSError:
        os.rename(final, aside)  # a filesystem without hard links
    return aside


def swap_in(tmp: Path, final: Path) -> Path | None:
    """Move ``tmp`` to ``final``; return where the old ``final`` was kept (None if none)."""
    aside = set_aside(final)
    try:
        os.replace(tmp, final)
    except BaseException:
        if aside is not None:
            if os.path.lexists(final) and os.path.samefile(aside, final):
                aside.unlink()  # a hard link of the untouched file (rename of links is a no-op)
            else:
                os.replace(aside, final)
        raise
    return aside


def put_back(moved: Iterable[tuple[Path, Path | None]]) -> None:
    """Undo ``swap_in`` calls, last first: old files return, new ones without a past go."""
    for final, aside in reversed(list(moved)):
        try:
            if aside is not None:
                os.replace(aside, final)
            else:
                final.unlink(missing_ok=True)
        except OSError as exc:
            logger.error("cannot restore %s in the offload folder: %s", final, exc)


def drop_kept(moved: Iterable[tuple[Path, Path | None]]) -> None:
    """After the commit point: delete the old files ``swap_in`` kept."""
    for final, aside in moved:
        if aside is not None:
            try:
                aside.unlink()
            except OSError as exc:
                logger.warning("cannot remove %s after replacing %s: %s", aside, final, exc)
