"""Where the workbench caches what it makes (demo checkpoints, converted GGUF files), and the
modes a finished cache folder gets."""

from __future__ import annotations

import os
from pathlib import Path


def workbench_cache_dir() -> Path:
    """The workbench's cache folder: ``$WORKBENCH_CACHE_DIR`` or the user cache folder."""
    explicit = os.environ.get("WORKBENCH_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "model-memory-workbench"


def make_readable(folder: Path) -> None:
    """Give the staged folder the modes a plain ``mkdir``/``open`` would (temp files are 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~umask)
