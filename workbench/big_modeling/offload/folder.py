"""The offload folder format: writing, indexing and reading offloaded weights, and the lazy
``Mapping`` views over a folder (``OffloadedWeightsLoader``, ``PrefixedDataset``).

An offload folder holds ``index.json`` and one raw file per offloaded tensor::

    index.json                {"h.0.weight": {"dtype": "bfloat16", "shape": [64, 64]}, ...}
    h.0.weight.dat            64*64*2 B = 8 KiB, the tensor's bytes exactly as stored in memory

bf16, fp8 and every other dtype are stored losslessly as their raw bits and read back with
``torch.from_file`` (a private memory map: zero copy, copy-on-write). An entry may instead point
into an existing safetensors file, served memory-mapped by ``safe_open``::

    {"h.1.weight": {"dtype": "float16", "shape": [64, 64],
                    "safetensors_file": "/abs/model.safetensors", "weight_name": "h.1.weight"}}

A quantized weight's entry carries a ``"torchao"`` record (class, attributes, and the index keys
of its packed inner tensors, themselves pointer entries into a ``*.quantized-*.safetensors`` file
of the folder); the loader rebuilds the torchao tensor on access (``quantization.packed``).

Entries of raw files also name the commit that wrote them (``"generation"``, ignored by
Accelerate's reader). The index is the commit point: data files are written first (under
temporary names, renamed in place), the index last and atomically, so a failure (full disk,
cancel) never leaves an index that names missing or half-written data. A kill (SIGKILL, OOM, power) mid-commit is repaired the
next time the folder is opened (``load_offload_index``, any writer): a journal written before
the first rename says which files to put back or, when the new index had landed, to drop (see
``workbench.big_modeling.file_swap``), so the index never names a mix of two loads' bytes.
Raw-file names can never escape the folder.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from workbench.big_modeling.devices import to_torch_device
from workbench.big_modeling.dtypes import dtype_name, lookup_dtype
from workbench.big_modeling.errors import CheckpointError, OffloadError
from workbench.big_modeling.file_swap import (
    commit_files,
    recover_interrupted_commit,
    sweep_leftovers,
)
from workbench.big_modeling.json_files import read_json
from workbench.big_modeling.offload.mapped_files import MappedFileCache
from workbench.big_modeling.progress import CancelToken, LoadProgress, ProgressCallback

logger = logging.getLogger(__name__)

INDEX_NAME = "index.json"
DATA_SUFFIX = ".dat"

_bytes_written = 0
_bytes_lock = threading.Lock()


def _discard(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def disk_bytes_written() -> int:
    """Total bytes of tensor data this process has written to offload folders.

    Read it before and after an operation to report what that operation wrote.

    Example:
        >>> before = disk_bytes_written()
    """
    return _bytes_written


def _parse_dtype(name: object, *, where: str) -> torch.dtype:
    dtype = lookup_dtype(name)
    if dtype is None:
        raise CheckpointError(
            f"{where}: unknown dtype {name!r}; expected a torch dtype name such as 'float16'."
        )
    return dtype


def _check_name(name: object, *, where: str) -> str:
    """A weight name must be one safe file-name component once ``.dat`` is appended."""
    bad = (
        not isinstance(name, str)
        or not name
        or "/" in name
        or "\\" in name
        or "\x00" in name
        or name in {".", ".."}
        or os.path.isabs(name)
    )
    if bad:
        raise CheckpointError(
            f"{where}: weight name {name!r} is not a plain file name (it contains a path "
            "separator, '..', or is absolute); offloaded weights must stay inside the folder. "
            "Rename the key or rewrite the index."
        )
    return name


def raw_weight_path(
    offload_folder: str | os.PathLike[str], weight_name: str, *, where: str | None = None
) -> Path:
    """Path of ``<weight_name>.dat`` in ``offload_folder``, refusing anything outside it.

    Raises:
        CheckpointError: when the name holds a path separator, or the file is a symlink that
            resolves outside the folder.
    """
    folder = Path(offload_folder)
    where = where or f"offload folder {folder}"
    path = folder / f"{_check_name(weight_name, where=where)}{DATA_SUFFIX}"
    if path.is_symlink() and not path.resolve().is_relative_to(folder.resolve()):
        raise CheckpointError(
            f"{path}: is a symlink to {path.resolve()}, outside the offload folder {folder}; "
            "remove the link and offload the weight again."
        )
    return path


def _validate_entry(key: str, info: object, *, where: str) -> dict[str, Any]:
    if not isinstance(info, dict):
        raise CheckpointError(f"{where}: entry {key!r} must be an object, found {info!r}.")
    if "dtype" not in info or "shape" not in info:
        missing = sorted({"dtype", "shape"} - set(info))
        raise CheckpointError(f"{where}: entry {key!r} lacks {', '.join(missing)}.")
    _parse_dtype(info["dtype"], where=f"{where}: entry {key!r}")
    shape = info["shape"]
    if not isinstance(shape, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise CheckpointError(
            f"{where}: entry {key!r} has shape {shape!r}; expected a list of non-negative ints."
        )
    file = info.get("safetensors_file")
    if file is None:
        return info
    if not isinstance(file, str) or not file.endswith(".safetensors") or not Path(file).is_file():
        raise CheckpointError(
            f"{where}: entry {key!r} points to {file!r}, which is not an existing *.safetensors "
            "file; restore the checkpoint or offload the weight again."
        )
    if not isinstance(info.get("weight_name", key), str):
        raise CheckpointError(f"{where}: entry {key!r} has a non-string weight_name.")
    return info


def load_offload_index(offload_folder: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Read and validate ``index.json`` of an offload folder.

    Args:
        offload_folder: the folder written by ``offload_state_dict``/``save_offload_index``.

    Returns:
        ``{name: {"dtype", "shape"[, "safetensors_file", "weight_name"]}}``; ``{}`` when the
        folder has no index yet.

    A commit that was killed midway is finished or rolled back first (logged as a warning).

    Raises:
        CheckpointError: malformed JSON, unknown dtypes, bad shapes, names escaping the folder,
            or pointers to missing safetensors files; the message names the file and the key.
            Also an interrupted commit that cannot be repaired (a read-only folder).

    Example:
        >>> index = load_offload_index("offload")  # doctest: +SKIP
    """
    repair_offload_folder(offload_folder)
    path = Path(offload_folder) / INDEX_NAME
    if not path.is_file():
        return {}
    index = read_json(
        path,
        what="an offload index (a JSON object of weight entries)",
        fix="Delete the folder and offload again.",
        error=CheckpointError,
    )
    if not isinstance(index, dict):
        raise CheckpointError(f"{path}: expected a JSON object of weight entries.")
    for key, info in index.items():
        _validate_entry(key, info, where=str(path))
        if info.get("safetensors_file") is None:
            raw_weight_path(offload_folder, key, where=str(path))
    return index


def repair_offload_folder(offload_folder: str | os.PathLike[str], *, sweep: bool = False) -> None:
    """Finish or undo a commit that a kill interrupted; with ``sweep``, drop every leftover.

    ``sweep`` is for writers opening the folder: hidden ``.tmp``/``.old`` files there are a
    killed writer's (this one has written nothing yet).

    Raises:
        CheckpointError: the interrupted commit cannot be repaired (see the message).
    """
    folder = Path(offload_folder)
    if not folder.is_dir():
        return
    done = recover_interrupted_commit(folder)
    if done is not None:
        logger.warning("offload folder %s: %s", folder, done)
    if sweep and (count := sweep_leftovers(folder)):
        logger.warning("offload folder %s: removed %d files a killed writer left", folder, count)


def _stage_raw_file(
    weight: torch.Tensor, weight_name: str, folder: Path
) -> tuple[Path, dict[str, Any]]:
    """Write ``weight``'s bytes under a temporary name in ``folder``; return it and its entry."""
    target = raw_weight_path(folder, weight_name)
    if weight.device.type == "meta" or weight.is_sparse or weight.is_quantized:
        raise CheckpointError(
            f"cannot offload {weight_name!r}: it is a {weight.layout}/{weight.device.type} "
            f"{dtype_name(weight.dtype)} tensor without plain data; load its weights first."
        )
    data = weight.detach().to("cpu").contiguous().reshape(-1)
    raw = data.view(torch.uint8) if data.numel() else data.new_empty(0, dtype=torch.uint8)
    tmp = folder / f".{target.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "xb") as handle:
            handle.write(memoryview(raw.numpy()))
    except OSError as exc:
        _discard(tmp)
        raise _write_failed(f"{weight_name!r} ({raw.numel()} B)", folder, exc) from exc
    _count_written(raw.numel())
    return tmp, {"dtype": dtype_name(weight.dtype), "shape": list(weight.shape)}


def _write_failed(what: str, folder: Path, exc: OSError) -> OffloadError:
    return OffloadError(
        exc.errno or errno.EIO,
        f"cannot write {what} to offload folder {folder}: {exc.strerror or exc}; free disk "
        "space or choose another offload folder.",
    )


def _count_written(nbytes: int) -> None:
    global _bytes_written
    with _bytes_lock:
        _bytes_written += nbytes


def offload_weight(
    weight: torch.Tensor,
    weight_name: str,
    offload_folder: str | os.PathLike[str],
    index: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write one tensor to ``<offload_folder>/<weight_name>.dat`` as raw bytes.

    The file is written under a temporary name and renamed into place, so readers that have the
    old file memory-mapped keep their data. The index is *not* saved: call
    ``save_offload_index`` once after a batch of weights.

    Args:
        weight: any dense tensor on any device (bf16/fp8 kept bit-exact).
        weight_name: the state-dict key; it must be a plain file name (no separators).
        offload_folder: an existing folder.
        index: a dict to record ``{"dtype", "shape"}`` in; a new one when None.

    Returns:
        ``index`` (or the new dict) with the entry for ``weight_name``.

    Raises:
        CheckpointError: meta/sparse tensors, names that would escape the folder.
        OffloadError: the write failed (disk full, read-only folder).

    Example:
        >>> index = offload_weight(torch.ones(2), "w", "offload")  # doctest: +SKIP
    """
    folder = Path(offload_folder)
    tmp, info = _stage_raw_file(weight, weight_name, folder)
    os.replace(tmp, raw_weight_path(folder, weight_name))
    index = {} if index is None else index
    index[weight_name] = info
    return index


def _merged_index(folder: Path, index: Mapping[str, Any]) -> dict[str, Any]:
    merged = load_offload_index(folder)
    for key, info in index.items():
        merged[key] = _validate_entry(key, info, where=f"new entries for {folder / INDEX_NAME}")
    return merged


def save_offload_index(
    index: Mapping[str, Any] | None, offload_folder: str | os.PathLike[str]
) -> None:
    """Merge ``index`` into ``<offload_folder>/index.json``, atomically.

    Args:
        index: entries to add or replace; nothing is written when empty or None.
        offload_folder: the offload folder.

    Raises:
        CheckpointError: the existing index is malformed, or an entry is invalid.
        OffloadError: the index could not be written (the old index is left intact).

    Example:
        >>> save_offload_index({"w": {"dtype": "float32", "shape": [2]}}, "offload")  # doctest: +SKIP
    """
    if not index:
        return
    folder = Path(offload_folder)
    _commit(folder, _merged_index(folder, index), staged=[])


def commit_offload(
    folder: Path, entries: Mapping[str, Any], staged: list[tuple[Path, Path]]
) -> None:
    """Merge ``entries`` into the index and swap ``staged`` ``(tmp, final)`` files in, kill-safe.

    Raises:
        CheckpointError: the existing index or an entry is malformed (nothing changed).
        OffloadError: a rename or the index write failed (the old files are back).
    """
    _commit(folder, _merged_index(folder, entries), staged)


def _commit(folder: Path, merged: dict[str, Any], staged: list[tuple[Path, Path]]) -> None:
    """Swap staged data files into place and write the index; the index lands last.

    Until it has, each replaced file is kept aside and put back when anything fails (or, after
    a kill, at the next open), so the previous index always names the bytes it described.
    """
    if staged:  # the entries of rewritten files name this commit, so two loads' indexes differ
        generation = uuid.uuid4().hex
        for _tmp, final in staged:
            name = final.name.removesuffix(DATA_SUFFIX)
            if name in merged:
                merged[name] = {**merged[name], "generation": generation}
    try:
        commit_files(staged, folder / INDEX_NAME, json.dumps(merged, indent=2))
    except BaseException as exc:
        if isinstance(exc, OSError) and not isinstance(exc, (CheckpointError, OffloadError)):
            raise OffloadError(
                exc.errno or errno.EIO,
                f"cannot write {folder / INDEX_NAME}: {exc.strerror or exc}; the previous index "
                "and its files are unchanged. Free disk space or choose another offload folder.",
            ) from exc
        raise


def offload_state_dict(
    save_dir: str | os.PathLike[str],
    state_dict: Mapping[str, torch.Tensor],
    *,
    cancel: CancelToken | None = None,
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """Offload every tensor of ``state_dict`` to ``save_dir`` and merge them into its index.

    All or nothing: on an error or a cancel, the files written so far are removed and the
    folder's previous index and data are left exactly as they were.

    Args:
        save_dir: the offload folder (created when missing).
        state_dict: names to tensors.
        cancel: keyword-only; checked between tensors (raises ``LoadCancelled``).
        progress: keyword-only; called after each tensor with phase ``"offloading"``.

    Returns:
        The entries written (``{name: {"dtype", "shape"}}``).

    Raises:
        CheckpointError, OffloadError, LoadCancelled.

    Example:
        >>> offload_state_dict("offload", {"w": torch.ones(2)})  # doctest: +SKIP
        {'w': {'dtype': 'float32', 'shape': [2]}}
    """
    folder = Path(save_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OffloadError(
            exc.errno or errno.EIO,
            f"cannot create offload folder {folder}: {exc.strerror or exc}; choose another folder.",
        ) from exc
    repair_offload_folder(folder, sweep=True)
    total_nbytes = sum(t.numel() * t.element_size() for t in state_dict.values())
    done_nbytes = 0
    staged: list[tuple[Path, Path]] = []
    index: dict[str, Any] = {}
    written: dict[tuple[Any, ...], Path] = {}  # each tensor's staged file, for its tied names
    try:
        for name, tensor in state_dict.items():
            if cancel is not None:
                cancel.raise_if_cancelled()
            same, target = _same_tensor(tensor), raw_weight_path(folder, name)
            if same in written:  # a tied name of a tensor staged already
                tmp, copied = stage_alias(written[same], target)
                index[name] = {"dtype": dtype_name(tensor.dtype), "shape": list(tensor.shape)}
                _count_written(copied)
            else:
                tmp, index[name] = _stage_raw_file(tensor, name, folder)
                if same is not None:
                    written[same] = tmp
            staged.append((tmp, target))
            done_nbytes += tensor.numel() * tensor.element_size()
            if progress is not None:
                progress(LoadProgress(done_nbytes, total_nbytes, name, "offloading"))
        if cancel is not None:
            cancel.raise_if_cancelled()
        _commit(folder, _merged_index(folder, index), staged)
    finally:
        for tmp, _ in staged:
            _discard(tmp)  # no-op for files already renamed into place
    return index


def _same_tensor(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    """What makes two names one tensor (tied weights): the same bytes of the same storage
    seen the same way; ``None`` for a tensor without host-addressable data."""
    if tensor.device.type == "meta" or tensor.is_sparse or tensor.is_quantized:
        return None
    storage = tensor.untyped_storage()
    return (
        tensor.device,
        storage.data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tensor.stride(),
        tensor.dtype,
    )


def stage_alias(first: Path, target: Path) -> tuple[Path, int]:
    """A staged file for ``target`` holding the bytes of the staged file ``first`` (a tied
    name: its own file, as the folder format wants, its bytes on disk once): a hard link, a
    copy where the file system makes none. Returns the staged path and the bytes it wrote
    (0 for a link).

    Raises:
        OffloadError: neither could be made.
    """
    tmp = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        os.link(first, tmp)
        return tmp, 0
    except OSError:
        pass
    try:
        shutil.copyfile(first, tmp)
    except OSError as exc:
        _discard(tmp)
        raise _write_failed(target.name, target.parent, exc) from exc
    return tmp, tmp.stat().st_size


def remove_offloaded_files(offload_folder: str | os.PathLike[str], names: Iterable[str]) -> int:
    """Delete ``<name>.dat`` for ``names`` and drop their entries from ``index.json``.

    For cleanup after a cancelled or failed load. Missing files are ignored.

    Returns:
        The number of bytes of data files removed.

    Example:
        >>> remove_offloaded_files("offload", ["w"])  # doctest: +SKIP
        8
    """
    folder = Path(offload_folder)
    names = list(names)
    removed_nbytes = 0
    for name in names:
        path = raw_weight_path(folder, name)
        if path.is_file() and not path.is_symlink():
            removed_nbytes += path.stat().st_size
        path.unlink(missing_ok=True)
    index = load_offload_index(folder)
    if any(name in index for name in names):
        for name in names:
            index.pop(name, None)
        _commit(folder, index, staged=[])
    return removed_nbytes


def load_offloaded_weight(
    weight_file: str | os.PathLike[str], weight_info: Mapping[str, Any]
) -> torch.Tensor:
    """Memory-map a raw ``.dat`` file as a tensor of the recorded dtype and shape (zero copy).

    The mapping is private (copy-on-write): writing to the tensor never changes the file.

    Args:
        weight_file: the ``.dat`` file.
        weight_info: its index entry (``{"dtype": ..., "shape": [...]}``).

    Returns:
        A CPU tensor backed by the file.

    Raises:
        CheckpointError: the file is missing or its size does not match dtype and shape.

    Example:
        >>> w = load_offloaded_weight("offload/w.dat", {"dtype": "float32", "shape": [2]})  # doctest: +SKIP
    """
    path = Path(weight_file)
    dtype = _parse_dtype(weight_info["dtype"], where=str(path))
    shape = tuple(weight_info["shape"])
    numel = 1
    for n in shape:
        numel *= n
    expected_nbytes = numel * dtype.itemsize
    try:
        found_nbytes = path.stat().st_size
    except FileNotFoundError as exc:
        raise CheckpointError(
            f"{path}: offloaded weight file is missing; offload the weights again."
        ) from exc
    if found_nbytes != expected_nbytes:
        raise CheckpointError(
            f"{path}: holds {found_nbytes} B but {dtype_name(dtype)}{list(shape)} needs "
            f"{expected_nbytes} B (truncated or stale); offload the weights again."
        )
    if expected_nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.from_file(str(path), shared=False, size=expected_nbytes, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


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


def _read_packed(
    key: str, info: Mapping[str, Any], weights: OffloadedWeightsLoader
) -> torch.Tensor:
    """A quantized weight (``"torchao"`` entry) rebuilt from its packed inner entries."""
    from workbench.big_modeling.quantization.packed import read_packed_entry  # noqa: PLC0415 (torchao is heavy)

    where = f"offload index of {weights.save_folder}"
    return read_packed_entry(key, info, weights, where=where)


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
        if "torchao" in info:  # a quantized weight: packed inner tensors, rebuilt per access
            tensor = _read_packed(key, info, self)
        elif file is not None:
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
