"""Write a state dict as a Hugging Face-style sharded safetensors checkpoint.

Used by the demo maker and by tests that need real checkpoints on disk.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from workbench.big_modeling.atomic import atomic_path, atomic_write_text

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclass(frozen=True)
class ShardProgress:
    """How far ``save_sharded_checkpoint`` is: ``shards_done`` of ``num_shards`` files written.

    Reported once before the first file (``shards_done == 0``) and after each file, so the last
    report has ``shards_done == num_shards`` and ``bytes_done == bytes_total``. ``num_shards``
    is the number of files actually written (a few large tensors may fill fewer than asked).
    """

    shards_done: int
    num_shards: int
    bytes_done: int
    bytes_total: int
    file_name: str = ""  # the file just written; "" in the first report

    @property
    def fraction(self) -> float:
        return 1.0 if self.bytes_total <= 0 else min(1.0, self.bytes_done / self.bytes_total)

    def describe(self) -> str:
        """``"writing shard 3 of 8"`` while writing, ``"wrote 8 shards"`` once done."""
        if self.shards_done < self.num_shards:
            return f"writing shard {self.shards_done + 1} of {self.num_shards}"
        return f"wrote {self.num_shards} shard{'s' if self.num_shards != 1 else ''}"


ShardCallback = Callable[[ShardProgress], None]


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
    *,
    progress: ShardCallback | None = None,
) -> Path:
    """Write ``state_dict`` into ``folder`` as ``num_shards`` safetensors files.

    With one shard the file is ``model.safetensors``; otherwise
    ``model-0000K-of-0000N.safetensors`` plus ``model.safetensors.index.json`` with a
    ``weight_map``, as ``transformers`` writes them. Tensors sharing storage (tied weights) are
    written once per name, as contiguous copies. Each file is written to a temporary name and
    renamed, so a crash never leaves a half-written shard under a real name. Copies are made
    one shard at a time, so the extra memory is one shard's tensors.

    Args:
        state_dict: names to tensors (on any CPU storage; tied tensors allowed).
        folder: where to write (created when missing).
        num_shards: how many files to cut the tensors into, by bytes, in order; fewer are
            written when there are too few tensors.
        metadata: extra ``__metadata__`` strings stored in every file (``format`` is ``pt``).
        progress: called with a ``ShardProgress`` before the first file and after each file.

    Returns:
        The path of the index (sharded) or of the single file.

    Raises:
        ValueError: ``num_shards`` < 1.

    Example:
        >>> save_sharded_checkpoint(model.state_dict(), "ckpt", num_shards=4)  # doctest: +SKIP
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format": "pt", **(metadata or {})}
    names = list(state_dict)
    sizes = {name: t.numel() * t.element_size() for name, t in state_dict.items()}
    total = sum(sizes.values())
    if num_shards == 1:
        groups = [names]
        file_names = [SINGLE_NAME]
    else:
        groups = _split_evenly(names, sizes, min(num_shards, max(1, len(names))))
        file_names = [
            f"model-{k:05d}-of-{len(groups):05d}.safetensors" for k in range(1, len(groups) + 1)
        ]
    report = progress or (lambda _: None)
    report(ShardProgress(0, len(groups), 0, total))
    done = 0
    weight_map: dict[str, str] = {}
    for k, (group, file_name) in enumerate(zip(groups, file_names, strict=True), start=1):
        tensors = {name: state_dict[name].detach().contiguous().clone() for name in group}
        _atomic_save(tensors, out / file_name, meta)
        del tensors  # free this shard's copies before the next shard's are made
        weight_map.update(dict.fromkeys(group, file_name))
        done += sum(sizes[name] for name in group)
        report(ShardProgress(k, len(groups), done, total, file_name))
    if num_shards == 1:
        return out / SINGLE_NAME
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    index_path = out / INDEX_NAME
    atomic_write_text(index_path, json.dumps(index, indent=2, sort_keys=True))
    return index_path


def _atomic_save(tensors: dict[str, torch.Tensor], target: Path, metadata: dict[str, str]) -> None:
    with atomic_path(target) as tmp:
        save_file(tensors, tmp, metadata=metadata)
