"""A real Hugging Face hub cache entry on disk, for tests of the offline cache support."""

from __future__ import annotations

import shutil
from pathlib import Path


def make_hub_cache_entry(root: Path, repo_id: str, source: Path) -> Path:
    """Lay out ``source``'s files as huggingface_hub caches them under ``root``: blobs, a
    snapshot of symlinks, ``refs/main``. Returns the snapshot folder."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for file in sorted(source.iterdir()):
        blob = repo / "blobs" / f"blob-{file.name}"
        shutil.copy(file, blob)
        (snapshot / file.name).symlink_to(blob)
    return snapshot
