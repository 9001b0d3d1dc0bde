"""All-or-nothing writes of a load's disk tier into an offload folder.

Weights that keep their dtype and live in a safetensors file are not copied at all: their index
entry points into the checkpoint (``safetensors_file`` + ``weight_name``). Only cast weights (or
weights from ``.bin`` files, or received over the network) are written, as ``<name>.dat`` raw bytes
in the format of ``workbench.big_modeling.offload.folder``, chunk by chunk (``StagedTensor.write``).

Data is staged under temporary names. ``commit()`` sets aside the previous load's files of the
same names (hard links, no data copied), renames the new files into place and merges the entries
into ``index.json`` atomically, last. If any of that fails, the set-aside files are put back, so
the previous index still names files holding the previous bytes; they are dropped only once the
new index is in place. A kill midway is repaired from the commit journal when the folder is next
opened (``OffloadStager.open`` and every reader; see ``workbench.big_modeling.file_swap``), and
``open`` also sweeps what a killed writer left. ``abort()`` (on an error, a full disk or a
cancel) removes every staged file, and the offload folder itself when this load created it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from workbench.big_modeling.dtypes import dtype_name
from workbench.big_modeling.errors import OffloadError
from workbench.big_modeling.loading.index import TensorInfo
from workbench.big_modeling.offload.folder import (
    commit_offload,
    raw_weight_path,
    repair_offload_folder,
    stage_alias,
)

logger = logging.getLogger(__name__)


def prepare_offload_folder(folder: str | os.PathLike[str] | None) -> Path:
    """Create ``folder`` if needed and prove it is writable with a probe file.

    Raises:
        OffloadError: no folder given, or it cannot be created or written (names the fix).
    """
    if folder is None:
        raise OffloadError(
            errno.EINVAL,
            "the device map sends weights to 'disk' but no offload_folder was given; pass offload_folder=",
        )
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{uuid.uuid4().hex[:8]}"
        with open(probe, "xb") as handle:
            handle.write(b"\0")
        probe.unlink()
    except OSError as exc:
        raise OffloadError(
            exc.errno or errno.EACCES,
            f"offload folder {path} is not writable ({exc.strerror or exc}); choose a folder you can write to",
        ) from None
    return path


def _first_missing(path: Path) -> Path | None:
    """The outermost folder ``mkdir(parents=True)`` would create for ``path`` (None: it exists)."""
    missing = None
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            break
        missing = candidate
    return missing


class StagedTensor:
    """The staged ``.dat`` files of one tensor (one per tied name), filled chunk by chunk.

    The first name's file is written; each other name (a tied alias) becomes a hard link to it
    once it is complete, so a tied tensor takes its bytes on disk once (SmolLM2-135M's tied
    embedding cast to float32 took 113 MiB a name) and every name still has its own file, as
    Accelerate's folder format wants. Where the file system has no hard links it is copied.
    """

    def __init__(self, stager: OffloadStager, names: Sequence[str], dtype: torch.dtype) -> None:
        self.stager, self.names, self.dtype = stager, list(names), dtype
        self.nbytes = 0
        self._fds: list[int] = []
        final = raw_weight_path(stager.folder, self.names[0])
        self._tmp = stager.folder / f".{final.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            self._fds.append(os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except OSError as exc:
            raise self._failed(exc) from None
        stager._staged.append((self._tmp, final))

    def write(self, chunk: torch.Tensor) -> None:
        """Append the bytes of the CPU tensor ``chunk`` (of ``dtype``) to the tensor's file.

        Raises:
            OffloadError: the write failed (disk full, I/O error); ``abort()`` removes the files.
        """
        flat = chunk.detach().contiguous().reshape(-1)
        if not flat.numel():
            return
        view = memoryview(flat.view(torch.uint8).numpy())
        try:
            for fd in self._fds:
                done = 0
                while done < len(view):
                    done += os.write(fd, view[done:])
        except OSError as exc:
            raise self._failed(exc) from None
        self.nbytes += len(view)

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.pop())

    def __enter__(self) -> StagedTensor:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
        if kind is None:
            self.stager.nbytes_written += self.nbytes
            for name in self.names[1:]:  # tied aliases, once the file is complete
                final = raw_weight_path(self.stager.folder, name)
                tmp, copied = stage_alias(self._tmp, final)
                self.stager._staged.append((tmp, final))
                self.stager.nbytes_written += copied

    def _failed(self, exc: OSError) -> OffloadError:
        self.close()
        return OffloadError(
            exc.errno or errno.EIO,
            f"cannot write tensor {self.names[0]!r} to offload folder {self.stager.folder}: "
            f"{exc.strerror or exc}; free disk space or choose another offload folder",
        )


class OffloadStager:
    """Collects a load's offload entries and staged data files until ``commit()``."""

    def __init__(self, folder: Path, *, created: Path | None = None) -> None:
        self.folder = folder
        self.created = created  # the outermost folder this load created (removed by abort)
        self.entries: dict[str, dict[str, Any]] = {}
        self._staged: list[tuple[Path, Path]] = []
        self.nbytes_written = 0

    @classmethod
    def open(cls, folder: str | os.PathLike[str] | None) -> OffloadStager:
        """``prepare_offload_folder(folder)`` and a stager remembering what it had to create."""
        created = None if folder is None else _first_missing(Path(folder))
        path = prepare_offload_folder(folder)
        repair_offload_folder(path, sweep=True)  # a killed load's half commit and leftovers
        return cls(path, created=created)

    def point_into(self, name: str, info: TensorInfo) -> None:
        """Record ``name`` as a zero-copy pointer into ``info``'s safetensors file."""
        self.entries[name] = {
            "dtype": dtype_name(info.dtype),
            "shape": list(info.shape),
            "safetensors_file": str(info.file.absolute()),
            "weight_name": info.name,
        }

    def stage(self, names: Sequence[str], dtype: torch.dtype, shape: Sequence[int]) -> StagedTensor:
        """Open staged ``<name>.dat`` files for one tensor; write it in chunks, then close.

        Example:
            >>> with stager.stage(["w"], torch.float16, (2, 2)) as out:  # doctest: +SKIP
            ...     out.write(torch.zeros(4, dtype=torch.float16))
        """
        staged = StagedTensor(self, names, dtype)
        for name in names:
            self.entries[name] = {"dtype": dtype_name(dtype), "shape": list(shape)}
        return staged

    def commit(self) -> None:
        """Move staged files into place, then merge the entries into ``index.json`` (atomic).

        Raises:
            OffloadError: renaming or writing the index failed; the folder is as it was.
            CheckpointError: the existing ``index.json`` is malformed; the folder is as it was.
        """
        try:
            if self.entries or self._staged:
                commit_offload(self.folder, self.entries, self._staged)
        except BaseException as exc:
            self.abort()
            if isinstance(exc, OSError) and not isinstance(exc, OffloadError):
                raise OffloadError(
                    exc.errno or errno.EIO,
                    f"cannot finish the offload folder {self.folder}: {exc.strerror or exc}; "
                    "the previous index and its files are unchanged. Free disk space or choose another folder",
                ) from None
            raise
        self._staged = []
        self.created = None  # the folder now holds this load's index: never remove it

    def abort(self) -> None:
        """Remove every staged file (and the folder if this load created it); idempotent."""
        for tmp, _final in self._staged:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        self._staged = []
        if self.created is not None:
            _remove_empty_tree(self.folder, self.created)
            self.created = None


def _remove_empty_tree(folder: Path, top: Path) -> None:
    """Remove ``folder`` and its parents up to ``top`` while they are empty."""
    current = folder
    while True:
        try:
            current.rmdir()
        except OSError:
            return
        if current in (top, current.parent):
            return
        current = current.parent
