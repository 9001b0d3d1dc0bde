"""Write a state dict as a Hugging Face-style sharded safetensors checkpoint.

Used by the demo maker and by tests that need real checkpoints on disk.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

from workbench.big_modeling.atomic import atomic_path, atomic_write_text

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def _split_evenly(names: list[str], sizes: dict[str, int], num_shards: int) -> list[list[str]]:
    """Cut ``names`` (in order) into ``num_shards`` runs of roughly equal bytes."""
    total = sum(sizes.values())
    target = total / num_shards if num_shards else total
    shards: list[list[str]] = [[]]
    filled = 0
    for name in names:
        if shards[-1] and filled >= target * len(shards) and len(shards) < num_shards:
            shards.append([])
        shards[-1].append(name)
        filled += sizes[name]
    return shards


def save_sharded_checkpoint(
    state_dict: Mapping[str, torch.Tensor],
    folder: str | os.PathLike[str],
    num_shards: int = 1,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write ``state_dict`` into ``folder`` as ``num_shards`` safetensors files.

    With one shard the file is ``model.safetensors``; otherwise
    ``model-0000K-of-0000N.safetensors`` plus ``model.safetensors.index.json`` with a
    ``weight_map``, as ``transformers`` writes them. Tensors sharing storage (tied weights) are
    written once per name, as contiguous copies. Each file is written to a temporary name and
    renamed, so a crash never leaves a half-written shard under a real name.

    Returns:
        The path of the index (sharded) or of the single file.

    Example:
        >>> save_sharded_checkpoint(model.state_dict(), "ckpt", num_shards=4)  # doctest: +SKIP
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().contiguous().clone() for name, t in state_dict.items()}
    meta = {"format": "pt", **(metadata or {})}
    if num_shards == 1:
        target = out / SINGLE_NAME
        _atomic_save(tensors, target, meta)
        return target
    names = list(tensors)
    sizes = {name: t.numel() * t.element_size() for name, t in tensors.items()}
    groups = _split_evenly(names, sizes, min(num_shards, max(1, len(names))))
    weight_map: dict[str, str] = {}
    for k, group in enumerate(groups, start=1):
        file_name = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        _atomic_save({name: tensors[name] for name in group}, out / file_name, meta)
        weight_map.update(dict.fromkeys(group, file_name))
    index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
    index_path = out / INDEX_NAME
    atomic_write_text(index_path, json.dumps(index, indent=2, sort_keys=True))
    return index_path


def _atomic_save(tensors: dict[str, torch.Tensor], target: Path, metadata: dict[str, str]) -> None:
    with atomic_path(target) as tmp:
        save_file(tensors, tmp, metadata=metadata)
