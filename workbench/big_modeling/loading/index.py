"""A header-only index of a checkpoint: every tensor's file, dtype, shape and byte size.

The planner and the GUI use ``CheckpointIndex`` for exact sizes; the loader uses it to validate a
checkpoint against the model before it changes anything. For safetensors only headers are read.

Accepted checkpoints (as the reference's ``load_checkpoint_in_model``):

- one ``.safetensors`` file, or one ``.bin`` / ``.pt`` / ``.pth`` file (a pickled state dict);
- a ``*.index.json`` of a sharded checkpoint (``{"weight_map": {tensor: shard}}``);
- a folder holding ``model.safetensors`` or ``pytorch_model.bin``, else exactly one
  ``*.index.json`` and its shards.

Example:
    >>> index = CheckpointIndex.from_path("llama-7b/")  # doctest: +SKIP
    >>> index.total_nbytes, index.tensors["lm_head.weight"].dtype  # doctest: +SKIP
    (13476839424, torch.float16)
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath

import torch

from workbench.big_modeling.errors import CheckpointError
from workbench.big_modeling.json_files import read_json
from workbench.big_modeling.loading.pickled import load_pickled_state_dict
from workbench.big_modeling.loading.safetensors_header import read_safetensors_header

SAFE_WEIGHTS_NAME = "model.safetensors"
WEIGHTS_NAME = "pytorch_model.bin"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """Where one tensor lives and what it is, read from headers only.

    ``data_offsets`` are the header's ``[begin, end)`` relative to ``data_start``, the absolute
    position of the file's data region; both are ``None``/``0`` for pickled (``.bin``) files.
    """

    name: str
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    data_offsets: tuple[int, int] | None = None
    data_start: int = 0

    @property
    def is_safetensors(self) -> bool:
        return self.data_offsets is not None

    @property
    def file_offset(self) -> int:
        """Absolute byte offset of the tensor's first byte in ``file`` (safetensors only)."""
        if self.data_offsets is None:
            raise CheckpointError(
                f"{self.file}: tensor {self.name!r} is pickled, it has no byte offset"
            )
        return self.data_start + self.data_offsets[0]


@dataclass(frozen=True)
class CheckpointIndex:
    """Every tensor of a checkpoint, in file order.

    Attributes:
        source: The path the user gave.
        tensors: Tensor name -> ``TensorInfo``.
        files: The weight files, in load order.
        index_file: The ``*.index.json`` used, if any.
        metadata: Per file, the safetensors ``__metadata__`` (empty for ``.bin``).
    """

    source: Path
    tensors: dict[str, TensorInfo]
    files: tuple[Path, ...]
    index_file: Path | None = None
    metadata: dict[Path, dict[str, str]] = field(default_factory=dict)

    @property
    def total_nbytes(self) -> int:
        """Bytes of tensor data, as stored."""
        return sum(info.nbytes for info in self.tensors.values())

    def dtype_counts(self) -> dict[torch.dtype, int]:
        """Number of tensors per stored dtype, most common first."""
        return dict(Counter(info.dtype for info in self.tensors.values()).most_common())

    def dtype_nbytes(self) -> dict[torch.dtype, int]:
        """Stored bytes per dtype."""
        totals: Counter[torch.dtype] = Counter()
        for info in self.tensors.values():
            totals[info.dtype] += info.nbytes
        return dict(totals.most_common())

    def by_file(self) -> dict[Path, list[TensorInfo]]:
        """Tensors grouped per file (files in load order, tensors in file order)."""
        grouped: dict[Path, list[TensorInfo]] = {file: [] for file in self.files}
        for info in self.tensors.values():
            grouped.setdefault(info.file, []).append(info)
        return grouped

    def __len__(self) -> int:
        return len(self.tensors)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> CheckpointIndex:
        """Index the checkpoint at ``path`` (file, ``*.index.json`` or folder; see module doc).

        Safetensors files are indexed from their headers alone. A pickled ``.bin``/``.pt`` has no
        header, so it is loaded with ``torch.load(weights_only=True, mmap=True)``: only the pickle
        structure is read, tensor data stays on disk until touched.

        Raises:
            CheckpointError: the path is missing, a folder without weights or with two index
                files, a malformed index, an index naming missing shards or escaping the folder, or
                a corrupt file; the message names the file and the problem.
        """
        source = Path(path)
        if source.is_dir() and not source.name.endswith(".index.json"):
            return cls._from_folder(source)
        if not source.exists():
            raise CheckpointError(
                f"{source}: no such file or folder; expected a checkpoint file, a *.index.json or a folder holding one"
            )
        if source.name.endswith(".json"):
            return cls._from_index_file(source, source)
        return cls._from_files(source, [source])

    @classmethod
    def _from_folder(cls, folder: Path) -> CheckpointIndex:
        for single in (SAFE_WEIGHTS_NAME, WEIGHTS_NAME):
            if (folder / single).is_file():
                return cls._from_files(folder, [folder / single])
        indexes = sorted(p.name for p in folder.glob("*.index.json"))
        if len(indexes) > 1:
            raise CheckpointError(
                f"{folder}: holds {len(indexes)} index files ({', '.join(indexes)}); pass the one to load as the checkpoint, or delete the others"
            )
        if not indexes:
            found = sorted(p.name for p in folder.iterdir())[:10]
            named_as_file = folder.suffix in (".safetensors", *PICKLE_SUFFIXES)
            what = (
                "is a directory, expected a checkpoint file; as a folder it "
                if named_as_file
                else ""
            )
            raise CheckpointError(
                f"{folder}: {what}holds no weights: expected {SAFE_WEIGHTS_NAME}, {WEIGHTS_NAME} or one *.index.json with its shards; found {found or 'nothing'}"
            )
        return cls._from_index_file(folder, folder / indexes[0])

    @classmethod
    def _from_index_file(cls, source: Path, index_file: Path) -> CheckpointIndex:
        weight_map = read_weight_map(index_file)
        folder = index_file.parent
        shard_of = {name: folder / shard for name, shard in weight_map.items()}
        shards = sorted(set(shard_of.values()))
        missing = sorted(str(p.relative_to(folder)) for p in shards if not os.path.lexists(p))
        if missing:
            raise CheckpointError(
                f"{index_file}: weight_map names {len(missing)} shard(s) that do not exist in {folder}: {', '.join(missing)}. Download the missing shards."
            )
        _refuse_escaping_links(index_file, shards)
        partial = cls._from_files(source, shards, index_file=index_file)
        tensors: dict[str, TensorInfo] = {}
        absent: list[str] = []
        for name, shard in shard_of.items():
            info = partial.tensors.get(name)
            if info is None or info.file != shard:
                absent.append(f"{name} (in {shard.name})")
                continue
            tensors[name] = info
        if absent:
            raise CheckpointError(
                f"{index_file}: weight_map lists {len(absent)} tensor(s) missing from their shard: {', '.join(sorted(absent)[:10])}"
            )
        ordered = {name: tensors[name] for name in partial.tensors if name in tensors}
        return cls(source, ordered, partial.files, index_file, partial.metadata)

    @classmethod
    def _from_files(
        cls, source: Path, files: list[Path], index_file: Path | None = None
    ) -> CheckpointIndex:
        tensors: dict[str, TensorInfo] = {}
        metadata: dict[Path, dict[str, str]] = {}
        expected = f"a shard file named in {index_file.name}" if index_file else "a checkpoint file"
        for file in files:
            if file.is_dir():
                raise CheckpointError(f"{file}: is a directory, expected {expected}")
            if not file.is_file():
                raise CheckpointError(f"{file}: is not a regular file, expected {expected}")
            infos, metadata[file] = _index_file(file)
            for info in infos:
                if info.name in tensors:
                    raise CheckpointError(
                        f"tensor {info.name!r} is stored twice: in {tensors[info.name].file} and {file}"
                    )
                tensors[info.name] = info
        return cls(source, tensors, tuple(files), index_file, metadata)


def _index_file(file: Path) -> tuple[list[TensorInfo], dict[str, str]]:
    if file.suffix in PICKLE_SUFFIXES:
        state = load_pickled_state_dict(file)
        infos = [
            TensorInfo(name, file, t.dtype, tuple(t.shape), t.numel() * t.element_size())
            for name, t in state.items()
        ]
        return infos, {}
    header = read_safetensors_header(file)
    infos = [
        TensorInfo(e.name, file, e.dtype, e.shape, e.nbytes, e.data_offsets, header.data_start)
        for e in header.entries.values()
    ]
    return infos, header.metadata


def read_weight_map(index_file: Path) -> dict[str, str]:
    """Read and validate the ``weight_map`` of a sharded-checkpoint index.

    Shard paths must be relative and stay inside the index's folder: absolute paths and ``..``
    components are refused, so an index can never make the loader read elsewhere.

    Raises:
        CheckpointError: malformed JSON, no ``weight_map`` object, non-string entries, or escaping
            shard paths (all offenders listed, sorted).
    """
    try:
        data = read_json(
            index_file,
            what="an index JSON file (a 'weight_map' of tensor name -> shard file)",
            fix="Re-download or regenerate the index.",
            error=CheckpointError,
        )
    except FileNotFoundError:
        raise CheckpointError(f"{index_file}: no such file") from None
    if isinstance(data, dict) and "weight_map" in data:
        data = data["weight_map"]
    if not isinstance(data, dict) or not data:
        raise CheckpointError(
            f"{index_file}: expected a non-empty 'weight_map' object of tensor name -> shard file"
        )
    bad_types = sorted(str(k) for k, v in data.items() if not isinstance(v, str) or not v)
    if bad_types:
        raise CheckpointError(
            f"{index_file}: weight_map entries are not shard file names: {', '.join(bad_types[:10])}"
        )
    escaping = sorted({v for v in data.values() if _escapes_folder(v)})
    if escaping:
        raise CheckpointError(
            f"{index_file}: weight_map points outside the checkpoint folder (absolute or '..' paths are refused): {', '.join(escaping)}"
        )
    return data


def _refuse_escaping_links(index_file: Path, shards: list[Path]) -> None:
    """Refuse shards that are links resolving outside the index's folder.

    ``..`` and absolute names are refused in the index itself; this closes the same door for
    a shard that is a symbolic link. The Hugging Face cache is the one exception: its
    snapshot files are links into the repository's ``blobs/``, so inside a
    ``models--org--name/snapshots/REV/`` folder links may resolve anywhere under
    ``models--org--name/``, and nowhere else.
    """
    folder = index_file.parent
    root = _hf_cache_repo_root(folder) or folder
    allowed = root.resolve()
    escaping = []
    for shard in shards:
        target = shard.resolve()
        if not target.is_relative_to(allowed):
            escaping.append(f"{shard.name} -> {target}")
    if escaping:
        raise CheckpointError(
            f"{index_file}: {len(escaping)} shard(s) are links that lead outside "
            f"{root}: {', '.join(sorted(escaping)[:10])}. Copy the files into the folder "
            "instead of linking them."
        )


def _hf_cache_repo_root(folder: Path) -> Path | None:
    """``.../models--org--name`` when ``folder`` is inside one of its ``snapshots/REV/``."""
    absolute = folder.absolute()
    for ancestor in absolute.parents:
        if ancestor.name == "snapshots" and ancestor.parent.name.startswith(
            ("models--", "datasets--", "spaces--")
        ):
            return ancestor.parent
    return None


def _escapes_folder(shard: str) -> bool:
    for flavour in (PurePosixPath, PureWindowsPath):
        pure = flavour(shard)
        if pure.is_absolute() or pure.anchor or ".." in pure.parts:
            return True
    return False
