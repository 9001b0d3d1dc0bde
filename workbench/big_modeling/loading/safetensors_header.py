"""Strict, header-only parsing of safetensors files.

A safetensors file is ``<u64 little-endian N><N bytes of JSON header><data>``. The header maps
each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the
start of the data region) plus an optional ``"__metadata__"`` of strings. We parse it ourselves so
every malformed file fails with an error that names the file, the tensor and the problem, before a
single byte of tensor data is read.

Example:
    >>> header = read_safetensors_header("model.safetensors")  # doctest: +SKIP
    >>> header.entries["lm_head.weight"].shape  # doctest: +SKIP
    (32000, 4096)
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workbench.big_modeling.errors import CheckpointError, first_names
from workbench.big_modeling.json_files import parse_json

# safetensors refuses headers above 100 MB; so do we (a corrupt length would otherwise allocate).
MAX_HEADER_NBYTES = 100 * 1024 * 1024
_LEN_NBYTES = 8

_DTYPE_NAMES: dict[str, str] = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
}
# Only the dtypes this torch build knows (uint16/float8_e8m0fnu are recent additions).
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    code: getattr(torch, name) for code, name in _DTYPE_NAMES.items() if hasattr(torch, name)
}
TORCH_TO_SAFETENSORS: dict[torch.dtype, str] = {v: k for k, v in SAFETENSORS_DTYPES.items()}


@dataclass(frozen=True, slots=True)
class HeaderEntry:
    """One tensor as the header describes it; ``data_offsets`` are relative to ``data_start``."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return self.data_offsets[1] - self.data_offsets[0]


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    """A validated header: entries in file order, metadata, and where the data region starts."""

    file: Path
    entries: dict[str, HeaderEntry]
    metadata: dict[str, str] = field(default_factory=dict)
    data_start: int = 0
    file_nbytes: int = 0


def _fail(path: Path, problem: str, fix: str = "") -> CheckpointError:
    tail = f" {fix}" if fix else ""
    return CheckpointError(f"{path}: {problem}.{tail}")


def read_safetensors_header(path: str | os.PathLike[str]) -> SafetensorsHeader:
    """Read and validate the header of a safetensors file without reading any tensor data.

    Checks: the file exists and is a regular file; the 8-byte length fits the file; the header is a
    JSON object; every dtype is known; shapes are lists of non-negative ints; each tensor's byte
    range matches its shape and dtype; ranges neither overlap, leave gaps, nor run past the end of
    the file (a truncated download).

    Args:
        path: The ``.safetensors`` file.

    Returns:
        The validated ``SafetensorsHeader``.

    Raises:
        CheckpointError: naming the file, the tensor and the problem.
    """
    file = Path(path)
    if file.is_dir():
        raise _fail(
            file,
            "is a directory, expected a .safetensors file",
            "Pass the file inside it or the folder as the checkpoint.",
        )
    try:
        with open(file, "rb") as handle:
            file_nbytes = os.fstat(handle.fileno()).st_size
            if file_nbytes == 0:
                raise _fail(file, "is empty (0 bytes)", "Re-download or re-save the checkpoint.")
            if file_nbytes < _LEN_NBYTES:
                raise _fail(
                    file,
                    f"is truncated: {file_nbytes} bytes, shorter than the 8-byte header length",
                )
            (header_nbytes,) = struct.unpack("<Q", handle.read(_LEN_NBYTES))
            if header_nbytes > MAX_HEADER_NBYTES:
                raise _fail(
                    file,
                    f"declares a {header_nbytes}-byte header, above the {MAX_HEADER_NBYTES}-byte limit; the file is corrupt or not safetensors",
                )
            if _LEN_NBYTES + header_nbytes > file_nbytes:
                raise _fail(
                    file,
                    f"declares a {header_nbytes}-byte header but the file has only {file_nbytes} bytes; it is truncated or not safetensors",
                )
            raw = handle.read(header_nbytes)
    except FileNotFoundError:
        raise CheckpointError(f"{file}: no such file") from None
    except IsADirectoryError:
        raise _fail(file, "is a directory, expected a .safetensors file") from None
    except PermissionError as exc:
        raise CheckpointError(f"{file}: cannot be read ({exc.strerror})") from None
    return parse_safetensors_header(file, raw, file_nbytes)


def parse_safetensors_header(file: Path, raw: bytes, file_nbytes: int) -> SafetensorsHeader:
    """Validate the JSON ``raw`` read from ``file`` (of ``file_nbytes`` bytes). See above."""
    decoded = parse_json(
        raw,
        source=f"{file} header",
        what="a safetensors header (a JSON object of tensor name -> dtype, shape, offsets)",
        fix="The file is corrupt; re-download it.",
        error=CheckpointError,
        max_depth=8,  # the format nests 3 levels
    )
    if not isinstance(decoded, dict):
        raise _fail(file, f"header is a JSON {type(decoded).__name__}, expected an object")
    metadata = decoded.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise _fail(file, "__metadata__ is not an object of strings")
    data_start = _LEN_NBYTES + len(raw)
    data_nbytes = file_nbytes - data_start
    entries = {name: _parse_entry(file, name, spec) for name, spec in decoded.items()}
    _check_layout(file, entries, data_nbytes)
    ordered = dict(sorted(entries.items(), key=lambda item: item[1].data_offsets))
    return SafetensorsHeader(
        file=file,
        entries=ordered,
        metadata={str(k): str(v) for k, v in metadata.items()},
        data_start=data_start,
        file_nbytes=file_nbytes,
    )


def _parse_entry(file: Path, name: str, spec: object) -> HeaderEntry:
    if not isinstance(spec, dict):
        raise _fail(file, f"tensor {name!r}: header entry is not an object")
    code = spec.get("dtype")
    dtype = SAFETENSORS_DTYPES.get(code) if isinstance(code, str) else None
    if dtype is None:
        known = ", ".join(sorted(SAFETENSORS_DTYPES))
        raise _fail(file, f"tensor {name!r}: unknown dtype {code!r}", f"Known dtypes: {known}.")
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise _fail(file, f"tensor {name!r}: shape {shape!r} is not a list of non-negative ints")
    offsets = spec.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise _fail(
            file,
            f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end] with 0 <= begin <= end",
        )
    entry = HeaderEntry(name, dtype, tuple(shape), (offsets[0], offsets[1]))
    expected = math.prod(shape) * dtype.itemsize
    if entry.nbytes != expected:
        raise _fail(
            file,
            f"tensor {name!r}: data_offsets {offsets} span {entry.nbytes} bytes but shape {tuple(shape)} of {code} needs {expected}",
        )
    return entry


def _check_layout(file: Path, entries: dict[str, HeaderEntry], data_nbytes: int) -> None:
    """Ranges must tile ``[0, data_nbytes)`` without overlap, and none may pass the end."""
    past_end = sorted(e.name for e in entries.values() if e.data_offsets[1] > data_nbytes)
    if past_end:
        worst = max(entries[n].data_offsets[1] for n in past_end)
        raise _fail(
            file,
            f"is truncated or its data offsets are out of range: {len(past_end)} tensor(s) end past the data region "
            f"({worst} > {data_nbytes} bytes): {first_names(past_end, limit=10)}",
            "Re-download the file.",
        )
    cursor, previous = 0, None
    for entry in sorted(entries.values(), key=lambda e: (e.data_offsets, e.name)):
        begin, end = entry.data_offsets
        if begin < cursor and entry.nbytes > 0:
            raise _fail(
                file,
                f"tensors {previous!r} and {entry.name!r} have overlapping data offsets (byte {begin} < {cursor})",
            )
        if begin > cursor:
            raise _fail(
                file,
                f"tensor {entry.name!r} starts at byte {begin}, leaving a gap after byte {cursor}; the data offsets are corrupt",
            )
        cursor, previous = max(cursor, end), entry.name
    if cursor != data_nbytes:
        raise _fail(
            file,
            f"has {data_nbytes - cursor} trailing bytes after the last tensor; the data offsets are corrupt",
        )
