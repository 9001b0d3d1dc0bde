"""Write the packed tensors of disk-tier quantized weights into an offload folder, once.

``quantize_model`` quantizes a ``"disk"`` module on the CPU and hands its packed weight to a
``DiskWriter``: the packed inner tensors go to ``<weight>.quantized-<id>.safetensors`` (written
atomically), and ``commit`` merges one index record per weight into the folder's ``index.json``:
a ``"torchao"`` entry naming those tensors, from which ``packed.read_packed_entry`` rebuilds the
weight lazily each time a hook brings the module in. ``abort`` removes the files a cancelled or
failed quantization wrote, leaving the index as it was.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from workbench.big_modeling.atomic import atomic_path
from workbench.big_modeling.dtypes import dtype_name
from workbench.big_modeling.errors import CheckpointError
from workbench.big_modeling.offload.folder import (
    OffloadedWeightsLoader,
    load_offload_index,
    save_offload_index,
)
from workbench.big_modeling.quantization.packed import flatten_packed

__all__ = ["PACKED_FILE_PATTERN", "DiskWriter"]

PACKED_FILE_PATTERN = re.compile(r".+\.quantized-[0-9a-f]{8}\.safetensors")
"""Names of the packed-weight files ``quantize_model`` writes into an offload folder."""


class DiskWriter:
    """Writes packed weights of disk modules to the offload folder; index merged at ``commit``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.weights = OffloadedWeightsLoader(save_folder=folder)
        self.entries: dict[str, dict[str, Any]] = {}
        self.files: list[Path] = []
        self._id = uuid.uuid4().hex[:8]

    def read(self, weight_name: str) -> torch.Tensor:
        if weight_name not in self.weights.index:
            raise CheckpointError(
                f"{weight_name} is on the meta device and offload folder {self.folder} has no "
                "entry for it; load the checkpoint with this offload folder before quantizing."
            )
        return self.weights[weight_name]

    def write(self, weight_name: str, packed: torch.Tensor) -> None:
        inner, record = flatten_packed(packed, where=weight_name)
        file = self.folder / f"{weight_name}.quantized-{self._id}.safetensors"
        keys = {name: f"{weight_name}:{name}" for name in inner}
        with atomic_path(file) as tmp:
            save_file({keys[name]: tensor for name, tensor in inner.items()}, str(tmp))
        self.files.append(file)
        for name, tensor in inner.items():
            self.entries[keys[name]] = {
                "dtype": dtype_name(tensor.dtype),
                "shape": list(tensor.shape),
                "safetensors_file": str(file.absolute()),
                "weight_name": keys[name],
            }
        self.entries[weight_name] = {
            "dtype": record["dtype"],
            "shape": record["shape"],
            "torchao": {
                "type": record["type"],
                "attributes": record["attributes"],
                "tensors": keys,
            },
        }

    def commit(self) -> None:
        """Merge the entries into ``index.json`` (atomic), then drop unreferenced packed files."""
        save_offload_index(self.entries, self.folder)
        referenced = {
            Path(info["safetensors_file"]).name
            for info in load_offload_index(self.folder).values()
            if "safetensors_file" in info
        }
        for path in self.folder.iterdir():
            if PACKED_FILE_PATTERN.fullmatch(path.name) and path.name not in referenced:
                path.unlink(missing_ok=True)  # a live model's memory map stays valid (POSIX)

    def abort(self) -> None:
        for file in self.files:
            file.unlink(missing_ok=True)
