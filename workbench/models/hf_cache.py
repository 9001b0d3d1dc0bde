"""Models already in the local Hugging Face cache, found offline (never touches the network).

Example:
    >>> [m.repo_id for m in list_cached_models()]  # doctest: +SKIP
    ['gpt2', 'meta-llama/Llama-3.1-8B']
    >>> open_model("hf-cache:gpt2")  # doctest: +SKIP
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub.constants import HF_HUB_CACHE

from workbench.models.errors import ModelSourceError

HF_CACHE_PREFIX = "hf-cache:"


@dataclass(frozen=True)
class CachedModel:
    """One cached model repository, at its newest snapshot.

    Attributes:
        repo_id: ``"org/name"``.
        snapshot_path: the snapshot folder (config.json, shards, tokenizer files).
        commit_hash: the snapshot's commit.
        size_on_disk: bytes of the whole repository in the cache.
        has_config: whether the snapshot holds a ``config.json``.
        has_weights: whether it holds ``*.safetensors`` files.
    """

    repo_id: str
    snapshot_path: Path
    commit_hash: str
    size_on_disk: int
    has_config: bool
    has_weights: bool


def hub_cache_dir() -> Path:
    """The hub cache folder, read from the environment at call time (``HF_HUB_CACHE``, then
    ``HF_HOME/hub``, then ``~/.cache/huggingface/hub``)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    return Path(HF_HUB_CACHE)


def list_cached_models(cache_dir: str | os.PathLike[str] | None = None) -> list[CachedModel]:
    """Return the cached model repositories (sorted by repo id); empty when there is no cache.

    Args:
        cache_dir: the hub cache folder; default ``HF_HUB_CACHE`` / ``~/.cache/huggingface/hub``.
    """
    from huggingface_hub import scan_cache_dir  # noqa: PLC0415 (scanning support imports slowly)
    from huggingface_hub.errors import CacheNotFound  # noqa: PLC0415 (with scan_cache_dir)

    if cache_dir is None:
        cache_dir = hub_cache_dir()
    try:
        info = scan_cache_dir(cache_dir)
    except CacheNotFound:
        return []
    models = []
    for repo in info.repos:
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revisions = sorted(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified))
        newest = revisions[-1]
        names = {file.file_name for file in newest.files}
        models.append(
            CachedModel(
                repo_id=repo.repo_id,
                snapshot_path=Path(newest.snapshot_path),
                commit_hash=newest.commit_hash,
                size_on_disk=repo.size_on_disk,
                has_config="config.json" in names,
                has_weights=any(name.endswith(".safetensors") for name in names),
            )
        )
    return sorted(models, key=lambda m: m.repo_id)


def resolve_cached_model(repo_id: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the snapshot folder of a cached repo (``"org/name"`` or ``"hf-cache:org/name"``).

    Raises:
        ModelSourceError: the repo is not cached (with close cached names), or its snapshot has
            no ``config.json``.
    """
    repo_id = repo_id.removeprefix(HF_CACHE_PREFIX)
    cached = {model.repo_id: model for model in list_cached_models(cache_dir)}
    model = cached.get(repo_id)
    if model is None:
        close = difflib.get_close_matches(repo_id, list(cached), n=3, cutoff=0.5)
        hint = f" Close cached models: {', '.join(close)}." if close else ""
        raise ModelSourceError(
            f"{repo_id!r} is not in the local Hugging Face cache ({len(cached)} models cached)."
            f"{hint} Download it first (huggingface-cli download {repo_id}); the workbench "
            "never downloads."
        )
    if not model.has_config:
        raise ModelSourceError(
            f"cached model {repo_id!r} has no config.json in {model.snapshot_path}; "
            "download the full repository"
        )
    return model.snapshot_path
