"""Lazy ``Mapping`` views of offloaded weights: ``OffloadedWeightsLoader`` and ``PrefixedDataset``.

``OffloadedWeightsLoader`` serves an offload folder (``offload`` describes the format) plus an
in-memory state dict; raw files are memory-mapped on access and kept open between forwards within
a byte budget (``mapped_files``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from workbench.big_modeling.devices import to_torch_device
from workbench.big_modeling.errors import CheckpointError
from workbench.big_modeling.mapped_files import MappedFileCache
from workbench.big_modeling.offload import (
    _parse_dtype,
    _validate_entry,
    load_offload_index,
    load_offloaded_weight,
    raw_weight_path,
)


class PrefixedDataset(Mapping[str, torch.Tensor]):
    """A view of ``dataset`` restricted to keys starting with ``prefix``, prefix stripped.

    Unlike Accelerate's, iteration yields the stripped keys and ``len`` counts only them.

    Example:
        >>> view = PrefixedDataset({"h.0.weight": torch.ones(1)}, "h.0.")
        >>> list(view)
        ['weight']
    """

    def __init__(self, dataset: Mapping[str, torch.Tensor], prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.dataset[f"{self.prefix}{key}"]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and f"{self.prefix}{key}" in self.dataset

    def __iter__(self) -> Iterator[str]:
        start = len(self.prefix)
        return (key[start:] for key in self.dataset if key.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for key in self.dataset if key.startswith(self.prefix))

    def __repr__(self) -> str:
        return f"PrefixedDataset(prefix={self.prefix!r}, dataset={type(self.dataset).__name__})"


class OffloadedWeightsLoader(Mapping[str, torch.Tensor]):
    """A lazy ``Mapping`` over an in-memory state dict plus offloaded weights.

    Keys are the state dict's, then the index's; the state dict wins on a clash. Raw entries
    are memory-mapped on access; safetensors entries are read through a cached ``safe_open``
    handle (memory-mapped, zero copy when dtype matches).

    Args:
        state_dict: tensors kept in memory.
        save_folder: offload folder; its ``index.json`` is used when ``index`` is None.
        index: entries as in ``index.json``.
        device: where offloaded tensors are returned (default CPU). State-dict tensors are
            returned as they are.
        map_cache_bytes: keyword only, beyond the reference. Raw files stay memory-mapped
            between accesses up to this many bytes (least recently used closed first), so a
            warm forward does not fault every page in again. None (default) allows a quarter
            of physical RAM; 0 maps each file anew on every access. Held maps count in the
            process's RSS as clean, reclaimable file pages. See ``mapped_files``.

    Raises:
        ValueError: when none of ``state_dict``, ``save_folder``, ``index`` is given.
        CheckpointError: a malformed index.

    Example:
        >>> weights = OffloadedWeightsLoader(save_folder="offload")  # doctest: +SKIP
        >>> weights["h.0.weight"].shape  # doctest: +SKIP
        torch.Size([64, 64])
    """

    def __init__(
        self,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        save_folder: str | os.PathLike[str] | None = None,
        index: Mapping[str, Any] | None = None,
        device: int | str | torch.device | None = None,
        *,
        map_cache_bytes: int | None = None,
    ) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise ValueError(
                "OffloadedWeightsLoader needs a state_dict, a save_folder or an index; got none."
            )
        self.state_dict = {} if state_dict is None else state_dict
        self.save_folder = None if save_folder is None else Path(save_folder)
        if index is None:
            index = load_offload_index(self.save_folder) if self.save_folder is not None else {}
        else:
            where = "offload index passed to OffloadedWeightsLoader"
            for key, info in index.items():
                _validate_entry(key, info, where=where)
        self.index = index
        self.all_keys = list(self.state_dict)
        self.all_keys.extend(key for key in self.index if key not in self.state_dict)
        self._key_set = set(self.all_keys)
        self.device = None if device is None else to_torch_device(device)
        self._handles: dict[str, Any] = {}
        self._handles_lock = threading.Lock()
        self.mapped_files = MappedFileCache(map_cache_bytes)

    def _safetensors_handle(self, file: str) -> Any:
        with self._handles_lock:
            handle = self._handles.get(file)
            if handle is None:
                handle = self._handles[file] = safe_open(file, framework="pt", device="cpu")
            return handle

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        info = self.index[key]
        file = info.get("safetensors_file")
        if file is not None:
            tensor = self._safetensors_handle(file).get_tensor(info.get("weight_name", key))
            dtype = _parse_dtype(info["dtype"], where=f"offload entry {key!r}")
            if list(tensor.shape) != list(info["shape"]):
                raise CheckpointError(
                    f"{file}: tensor {info.get('weight_name', key)!r} has shape "
                    f"{list(tensor.shape)}, but the offload index records {info['shape']} for "
                    f"{key!r}; rebuild the offload index for this checkpoint."
                )
            tensor = tensor.to(dtype)
        else:
            if self.save_folder is None:
                raise CheckpointError(
                    f"offload entry {key!r} names a raw .dat file but no save_folder was given; "
                    "pass save_folder= to OffloadedWeightsLoader."
                )
            tensor = self.mapped_files.get(
                raw_weight_path(self.save_folder, key),
                lambda path: load_offloaded_weight(path, info),
            )
        if self.device is not None and tensor.device != self.device:
            tensor = tensor.to(self.device)
        return tensor

    def __contains__(self, key: object) -> bool:
        return key in self._key_set

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)

    def __repr__(self) -> str:
        return (
            f"OffloadedWeightsLoader({len(self.state_dict)} in memory, "
            f"{len(self.all_keys) - len(self.state_dict)} offloaded, folder={self.save_folder})"
        )
