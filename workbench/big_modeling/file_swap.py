"""Replace files so that a failure *or a kill* before the commit point puts every old file back.

Used by the offload folder writers: data files are swapped in first, ``index.json`` lands last;
until it has, each replaced file is kept under a hidden name and restored when anything fails.

An exception is undone at once (``put_back``). A SIGKILL, a power cut or an OOM kill cannot run
any handler, so ``commit_files`` first writes a journal (``.commit-journal.json``: each
``(staged, final, kept-aside)`` name, whether ``final`` existed, and the SHA-256 of the new
index). ``recover_interrupted_commit``, run when the folder is next opened, reads it: if the
index on disk is the new one the commit had finished and the kept files are dropped (roll
forward); otherwise every swapped file is put back (roll back). Either way the index names
exactly the bytes it describes, never a mix, and the leftovers are swept.

Example:
    >>> from pathlib import Path
    >>> set_aside(Path("/nonexistent/file")) is None  # nothing there to keep
    True
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import logging
import os
import shutil
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path

from workbench.big_modeling.atomic import atomic_write_text
from workbench.big_modeling.errors import CheckpointError
from workbench.big_modeling.json_files import read_json

logger = logging.getLogger(__name__)

JOURNAL_NAME = ".commit-journal.json"
_LEFTOVER_SUFFIXES = (".tmp", ".old")


def aside_name(final: Path) -> Path:
    """A fresh hidden name beside ``final`` to keep its old file under."""
    return final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.old")


def set_aside(final: Path, aside: Path | None = None) -> Path | None:
    """Keep the file now at ``final`` under a hidden name (``aside``); None when there is none."""
    if not os.path.lexists(final):
        return None
    aside = aside or aside_name(final)
    try:
        os.link(final, aside, follow_symlinks=False)  # no window in which ``final`` is missing
    except OSError:
        os.rename(final, aside)  # a filesystem without hard links
    return aside


def swap_in(tmp: Path, final: Path, aside: Path | None = None) -> Path | None:
    """Move ``tmp`` to ``final``; return where the old ``final`` was kept (None if none)."""
    aside = set_aside(final, aside)
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


def commit_files(staged: list[tuple[Path, Path]], index_path: Path, index_text: str) -> None:
    """Swap the staged files of one folder into place, then write ``index_path``, kill-safe.

    Args:
        staged: ``(temporary file, final path)`` pairs, all in ``index_path``'s folder.
        index_path: the index, written last and atomically: the commit point.
        index_text: its new content.

    Raises:
        OSError: a swap or the index write failed; every old file is back (``put_back``).
    """
    folder = index_path.parent
    journal = folder / JOURNAL_NAME
    moves = [(tmp, final, aside_name(final)) for tmp, final in staged]
    if moves:  # without data files the atomic index write alone is all or nothing
        record = {
            "index": index_path.name,
            "index_sha256": hashlib.sha256(index_text.encode("utf-8")).hexdigest(),
            "moves": [
                [tmp.name, final.name, aside.name, os.path.lexists(final)]
                for tmp, final, aside in moves
            ],
        }
        atomic_write_text(journal, json.dumps(record))
    moved: list[tuple[Path, Path | None]] = []
    try:
        for tmp, final, aside in moves:
            moved.append((final, swap_in(tmp, final, aside)))
        atomic_write_text(index_path, index_text)
    except BaseException:
        put_back(moved)
        _unlink_quietly(journal)
        raise
    drop_kept(moved)
    _unlink_quietly(journal)


def recover_interrupted_commit(folder: Path) -> str | None:
    """Finish or undo a ``commit_files`` that was killed; sweep its leftovers.

    Returns:
        ``None`` when no commit was interrupted, else what was done, for the log.

    Raises:
        CheckpointError: the journal is unreadable or names files outside the folder, or the
            folder cannot be repaired (read-only); the message says to delete the folder.
    """
    journal = folder / JOURNAL_NAME
    if not os.path.lexists(journal):
        return None
    fix = f"Delete the folder {folder} and load again."
    record = read_json(
        journal, what="an offload commit journal", fix=fix, error=CheckpointError, max_depth=4
    )
    moves, index_name, digest = _journal_moves(journal, record, fix)
    index = folder / index_name
    finished = False
    try:
        on_disk = index.read_bytes() if index.is_file() else b""
        finished = hashlib.sha256(on_disk).hexdigest() == digest
        for tmp_name, final_name, aside_name_, existed in reversed(moves):
            tmp, final, aside = folder / tmp_name, folder / final_name, folder / aside_name_
            if finished:
                aside.unlink(missing_ok=True)
            elif os.path.lexists(aside):
                os.replace(aside, final)  # the old bytes return under their name
            elif not existed:
                final.unlink(missing_ok=True)  # new name, no past: the old index never named it
            tmp.unlink(missing_ok=True)
        journal.unlink()
    except OSError as exc:
        raise CheckpointError(
            f"{folder}: a commit was interrupted (killed) and cannot be "
            f"{'finished' if finished else 'rolled back'}: {exc.strerror or exc}. {fix}"
        ) from None
    swept = sweep_leftovers(folder)
    done = "finished (the new index had landed)" if finished else "rolled back to the old index"
    return f"an interrupted commit of {len(moves)} files was {done}; {swept} leftovers swept"


def _journal_moves(
    journal: Path, record: object, fix: str
) -> tuple[list[tuple[str, str, str, bool]], str, str]:
    def plain(name: object) -> bool:
        return (
            isinstance(name, str)
            and name not in ("", ".", "..")
            and "/" not in name
            and "\\" not in name
            and "\x00" not in name
        )

    bad = CheckpointError(f"{journal}: not a commit journal this workbench wrote. {fix}")
    if not isinstance(record, dict):
        raise bad
    moves, index_name, digest = record.get("moves"), record.get("index"), record.get("index_sha256")
    if not (plain(index_name) and isinstance(digest, str) and isinstance(moves, list)):
        raise bad
    checked = []
    for move in moves:
        if not (
            isinstance(move, list)
            and len(move) == 4
            and all(plain(name) for name in move[:3])
            and isinstance(move[3], bool)
        ):
            raise bad
        checked.append((move[0], move[1], move[2], move[3]))
    return checked, index_name, digest


def sweep_leftovers(folder: Path) -> int:
    """Delete hidden ``.*.tmp`` / ``.*.old`` files a killed writer left; return how many.

    Only call it where no other writer works in ``folder`` (a writer's open, a recovery).
    """
    count = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        leftover = entry.name.startswith(".") and entry.name.endswith(_LEFTOVER_SUFFIXES)
        if leftover and (entry.is_file(follow_symlinks=False) or entry.is_symlink()):
            _unlink_quietly(Path(entry.path))
            count += 1
    return count


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        logger.warning("cannot remove %s: %s", path, exc)


_RENAME_EXCHANGE = 2  # linux/fs.h


def replace_directory(new: Path, target: Path) -> None:
    """Put the folder ``new`` at ``target``; an old ``target`` is removed only once ``new`` is there.

    On Linux the two folders are exchanged in one ``renameat2(RENAME_EXCHANGE)`` call, so
    ``target`` is never missing and a kill at any point leaves either the whole old folder or
    the whole new one there. Elsewhere, two renames (old aside, new in); the gap between them
    is two system calls long, and a failure of the second puts the old folder back. The old
    copy is then deleted under a hidden ``.NAME.*.old`` name (``sweep_old_directories``
    removes one a kill left).

    Raises:
        OSError: the move failed; ``target`` is as it was.
    """
    if not os.path.lexists(target):
        os.replace(new, target)
        return
    if _exchange(new, target):
        old = new  # ``new``'s path now holds the old folder
    else:
        old = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.old")
        os.rename(target, old)
        try:
            os.replace(new, target)
        except BaseException:
            os.rename(old, target)
            raise
    aside = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.old")
    try:
        os.rename(old, aside)  # a name sweep_old_directories knows, then the slow delete
    except OSError:
        aside = old
    shutil.rmtree(aside, ignore_errors=True)


def sweep_old_directories(target: Path) -> int:
    """Delete ``.NAME.*.old`` folders beside ``target`` that a killed replacement left."""
    count = 0
    for path in target.parent.glob(f".{target.name}.*.old"):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            count += 1
    return count


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2``); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    result = renameat2(
        at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), _RENAME_EXCHANGE
    )
    if result == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False  # this filesystem cannot exchange: fall back to two renames
    raise OSError(error, os.strerror(error), str(second))
