"""Per-load offload folders named after the process that owns them, and a sweep of dead ones.

A folder is ``workbench-offload-<pid>-<random>`` under the offload root. A host that dies
(killed, crashed) cannot delete its folder; the next host sweeps folders whose owner is gone.
A folder whose owner still runs is never touched, nor is anything not named this way.

Example:
    >>> folder = new_offload_folder(None)  # doctest: +SKIP
    >>> sweep_stale_offload_folders(None)  # doctest: +SKIP
    []
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import psutil

from workbench.big_modeling.errors import OffloadError
from workbench.models.hardware import OFFLOAD_DIR_ENV, default_offload_root

logger = logging.getLogger(__name__)

PREFIX = "workbench-offload-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-")
CLOCK_SLACK_S = 2.0


def offload_root(root: str | os.PathLike[str] | None) -> Path:
    """The folder offload folders go under: ``root``, else ``default_offload_root()``
    (``$WORKBENCH_OFFLOAD_DIR`` or the system temporary folder, where disk budgets are
    measured)."""
    if root is not None:
        return Path(root)
    return default_offload_root()


def new_offload_folder(root: str | os.PathLike[str] | None, pid: int | None = None) -> Path:
    """Create an empty offload folder owned by ``pid`` (this process by default).

    Raises:
        OffloadError: when the folder cannot be created; the message names the folder, the
            reason and how to choose another root (``$WORKBENCH_OFFLOAD_DIR``).
    """
    base = offload_root(root)
    owner = os.getpid() if pid is None else pid
    try:
        base.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{owner}-", dir=base))
    except OSError as exc:
        raise OffloadError(_cannot_create_message(base, root, exc)) from exc


def _cannot_create_message(base: Path, root: object, exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    if root is not None:
        chosen = "the offload root given to the worker host"
    elif os.environ.get(OFFLOAD_DIR_ENV):
        chosen = f"${OFFLOAD_DIR_ENV}"
    else:
        chosen = "the system temporary folder"
    return (
        f"cannot create the offload folder under {base} ({chosen}): {reason}. "
        f"Weights put on disk are written there while the model loads. Set {OFFLOAD_DIR_ENV} "
        "to a writable folder with room for the disk part of the map, then load again."
    )


def owner_pid(folder: Path) -> int | None:
    """The pid in an offload folder's name, or ``None`` for any other name."""
    match = _NAME.match(folder.name)
    return int(match.group(1)) if match else None


def owner_is_alive(pid: int, folder: Path) -> bool:
    """True when ``pid`` runs and started before ``folder`` was made (not a reused pid)."""
    try:
        started = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # exists but cannot be inspected: assume it is the owner
        return True
    try:
        made = folder.stat().st_mtime
    except OSError:
        return True
    return started <= made + CLOCK_SLACK_S


def sweep_stale_offload_folders(root: str | os.PathLike[str] | None) -> list[Path]:
    """Delete the offload folders under ``root`` whose owning process is dead; return them."""
    base = offload_root(root)
    try:
        entries = list(base.iterdir())
    except OSError:
        return []
    removed: list[Path] = []
    for entry in entries:
        pid = owner_pid(entry)
        if pid is None or pid == os.getpid() or not entry.is_dir() or entry.is_symlink():
            continue
        if owner_is_alive(pid, entry):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append(entry)
            logger.info("removed the offload folder of dead process %d: %s", pid, entry)
    return removed
