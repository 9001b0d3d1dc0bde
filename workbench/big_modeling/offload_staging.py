"""All-or-nothing writes of a load's disk tier into an offload folder.

Weights that keep their dtype and live in a safetensors file are not copied at all: their index
entry points into the checkpoint (``safetensors_file`` + ``weight_name``). Only cast weights (or
weights from ``.bin`` files, or received over the network) are written, as ``<name>.dat`` raw bytes
in the format of ``workbench.big_modeling.offload``.

Data is staged under temporary names; ``commit()`` renames it into place and merges the entries
into ``index.json`` atomically (the index is written last). ``abort()`` (on an error, a full disk
or a cancel) removes every staged file, so the folder is exactly as it was.
"""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path
from typing import Any

import torch

from workbench.big_modeling.checkpoint import TensorInfo
from workbench.big_modeling.errors import OffloadError
from workbench.big_modeling.offload import dtype_name, raw_weight_path, save_offload_index


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


class OffloadStager:
    """Collects a load's offload entries and staged data files until ``commit()``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.entries: dict[str, dict[str, Any]] = {}
        self._staged: list[tuple[Path, Path]] = []
        self.nbytes_written = 0

    def point_into(self, name: str, info: TensorInfo) -> None:
        """Record ``name`` as a zero-copy pointer into ``info``'s safetensors file."""
        self.entries[name] = {
            "dtype": dtype_name(info.dtype),
            "shape": list(info.shape),
            "safetensors_file": str(info.file.absolute()),
            "weight_name": info.name,
        }

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Stage ``tensor``'s bytes (CPU, contiguous) as ``<name>.dat``.

        Raises:
            OffloadError: the write failed (disk full, I/O error); the staged file is removed.
        """
        final = raw_weight_path(self.folder, name)
        tmp = self.folder / f".{final.name}.{uuid.uuid4().hex[:8]}.tmp"
        data = tensor.detach().contiguous().reshape(-1)
        raw = data.view(torch.uint8) if data.numel() else torch.empty(0, dtype=torch.uint8)
        view = memoryview(raw.numpy())
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            self._staged.append((tmp, final))
            try:
                done = 0
                while done < len(view):
                    done += os.write(fd, view[done:])
            finally:
                os.close(fd)
        except OSError as exc:
            raise OffloadError(
                exc.errno or errno.EIO,
                f"cannot write tensor {name!r} ({len(view)} B) to offload folder {self.folder}: "
                f"{exc.strerror or exc}; free disk space or choose another offload folder",
            ) from None
        self.nbytes_written += len(view)
        self.entries[name] = {"dtype": dtype_name(tensor.dtype), "shape": list(tensor.shape)}

    def commit(self) -> None:
        """Move staged files into place, then merge the entries into ``index.json`` (atomic).

        Raises:
            OffloadError: renaming or writing the index failed; staged files are removed.
        """
        try:
            for tmp, final in self._staged:
                os.replace(tmp, final)
            save_offload_index(self.entries, self.folder)
        except OSError as exc:
            self.abort()
            if isinstance(exc, OffloadError):
                raise
            raise OffloadError(
                exc.errno or errno.EIO,
                f"cannot finish the offload folder {self.folder}: {exc.strerror or exc}; free disk space or choose another folder",
            ) from None
        self._staged = []

    def abort(self) -> None:
        """Remove every file this stager wrote (staged or renamed); the index is untouched."""
        for tmp, final in self._staged:
            for path in (tmp, final):
                try:
                    if path == final and tmp.exists():
                        continue  # not renamed yet: the final name may be someone else's file
                    path.unlink(missing_ok=True)
                except OSError:
                    pass
        self._staged = []
