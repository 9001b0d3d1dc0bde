"""Read a GGUF file's header: architecture, hyper-parameters, and each tensor's name, shape,
quantization type and stored bytes, without touching tensor data.

The ``gguf`` package's own ``GGUFReader`` (memory-mapped) parses the file; this module turns its
fields and tensors into a ``GGUFHeader`` and its failures into a ``ModelSourceError`` naming the
file. The bytes are the file's own (a Q4_1 block of 32 weights takes 20 bytes, a Q8_0 block 34;
``gguf.GGML_QUANT_SIZES`` is the table), never a bits-per-weight estimate.

``GGUFReader`` turns every token of a 49,152-entry vocabulary into numpy views, several seconds
of CPU for a 98 MB file, so the summary is cached per file (resolved path, size and
modification time): the cost is paid once per file per process, on the caller's worker thread.

Example:
    >>> header = read_gguf_header("SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP
    >>> header.architecture, header.tensors[0].quant_type, header.tensors[0].stored_nbytes
    ('llama', 'Q8_0', 30081024)
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.models.errors import ModelSourceError

if TYPE_CHECKING:
    from gguf import GGUFReader, ReaderField

GGUF_SUFFIX = ".gguf"
GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Header values are kept unless they are arrays of more than this many items (vocabularies,
# merges, token types); those keep only their length.
_ARRAY_KEEP_LIMIT = 64
# Parsed headers kept per process (each holds the fields and tensor table, not the vocabulary).
_CACHE_SIZE = 16


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor of a GGUF file, from its header.

    Attributes:
        name: the GGUF name (``blk.0.attn_q.weight``).
        shape: in torch order (rows first), e.g. ``(576, 576)``.
        quant_type: the ggml type name (``Q4_1``, ``Q8_0``, ``F32``, ``Q4_K``...).
        stored_nbytes: bytes the tensor takes in the file.
        offset: byte offset of its data from the start of the data section.
    """

    name: str
    shape: tuple[int, ...]
    quant_type: str
    stored_nbytes: int
    offset: int

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF file says about itself, without its tensor data.

    Attributes:
        path: the file.
        version: GGUF format version (2 or 3).
        architecture: ``general.architecture`` (``llama``, ``qwen2``...).
        name: ``general.name`` or ``""``.
        fields: every header value; long arrays (the vocabulary) as ``"<49152 items>"``.
        array_lengths: the length of every array field.
        tensors: in file order.
        data_offset: where tensor data starts in the file.
        file_nbytes: the file's size.
    """

    path: Path
    version: int
    architecture: str
    name: str
    fields: dict[str, Any]
    array_lengths: dict[str, int]
    tensors: list[GGUFTensorInfo] = field(repr=False)
    data_offset: int
    file_nbytes: int

    @property
    def stored_nbytes(self) -> int:
        """Bytes of all tensors as stored."""
        return sum(t.stored_nbytes for t in self.tensors)

    @property
    def quant_types(self) -> dict[str, int]:
        """How many tensors each quantization type stores, most common first."""
        counts: dict[str, int] = {}
        for tensor in self.tensors:
            counts[tensor.quant_type] = counts.get(tensor.quant_type, 0) + 1
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

    def arch_field(self, key: str, default: Any = None) -> Any:
        """The value of ``<architecture>.<key>`` (``block_count``...), or ``default``."""
        return self.fields.get(f"{self.architecture}.{key}", default)

    def hyper_parameters(self) -> dict[str, Any]:
        """The ``<architecture>.*`` fields without the prefix, e.g. ``{"block_count": 30}``."""
        prefix = f"{self.architecture}."
        return {k.removeprefix(prefix): v for k, v in self.fields.items() if k.startswith(prefix)}


def is_gguf_path(source: str | os.PathLike[str]) -> bool:
    """Whether ``source`` names a ``.gguf`` file (by suffix; the header check comes later)."""
    return os.fspath(source).lower().endswith(GGUF_SUFFIX)


def read_gguf_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Read the header of a GGUF file: fields and tensor table, no tensor data.

    The ``gguf`` package's ``GGUFReader`` parses it (seconds for a large vocabulary), once per
    file per process: the summary is cached on the resolved path, size and modification time,
    so a changed file is read again. Call it off the GUI thread.

    Args:
        path: a ``.gguf`` file.

    Returns:
        A ``GGUFHeader`` (its own copy of the cached fields and tensor table).

    Raises:
        ModelSourceError: unreadable file, wrong magic (not GGUF), a big-endian or unknown
            version, an unknown value or quantization type, or a file cut short (naming where
            its header ended, or the tensor that runs past its end).

    Example:
        >>> read_gguf_header("model.gguf").hyper_parameters()["block_count"]  # doctest: +SKIP
        30
    """
    file = Path(path)
    try:
        with file.open("rb"):
            stat = file.stat()
        resolved = file.resolve()
    except OSError as exc:
        raise ModelSourceError(f"cannot read {file}: {exc.strerror or exc}") from exc
    try:
        cached = _cached_header(str(resolved), stat.st_size, stat.st_mtime_ns)
    except _Problem as problem:
        raise ModelSourceError(f"{file}{problem}") from problem.__cause__
    return dataclasses.replace(
        cached,
        path=file,
        fields=dict(cached.fields),
        array_lengths=dict(cached.array_lengths),
        tensors=list(cached.tensors),
    )


class _Problem(Exception):
    """What is wrong with a GGUF file; the text follows the file's name (``" is truncated..."``).

    Raised inside the cached parse so its message can name the path the caller gave."""


class _ShortRead(Exception):
    """A read of the header that runs past the end of the file."""

    def __init__(self, end: int) -> None:
        super().__init__(end)
        self.end = end


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _cached_header(resolved: str, file_nbytes: int, mtime_ns: int) -> GGUFHeader:
    """The header of the file at ``resolved`` with this size and modification time."""
    del mtime_ns  # part of the cache key only: a rewritten file is parsed again
    reader = _open_reader(Path(resolved), file_nbytes)
    fields: dict[str, Any] = {}
    array_lengths: dict[str, int] = {}
    for key, reader_field in reader.fields.items():
        if key.startswith("GGUF."):  # the reader's own entries: version and counts
            continue
        fields[key], length = _field_value(reader_field)
        if length is not None:
            array_lengths[key] = length
    data_offset = int(reader.data_offset)
    tensors = []
    for tensor in reader.tensors:
        start, stored = int(tensor.data_offset), int(tensor.n_bytes)
        if start + stored > file_nbytes:
            raise _Problem(
                f" is truncated: tensor {tensor.name!r} ends at byte {start + stored:,}, "
                f"the file has {file_nbytes:,}"
            )
        # GGUF lists dimensions fastest-varying first; torch lists rows first.
        shape = tuple(int(dim) for dim in reversed(tensor.shape.tolist()))
        tensors.append(
            GGUFTensorInfo(tensor.name, shape, tensor.tensor_type.name, stored, start - data_offset)
        )
    architecture = str(fields.get("general.architecture", ""))
    if not architecture:
        raise _Problem(" has no general.architecture field")
    return GGUFHeader(
        path=Path(resolved),
        version=int(reader.fields["GGUF.version"].contents()),
        architecture=architecture,
        name=str(fields.get("general.name", "")),
        fields=fields,
        array_lengths=array_lengths,
        tensors=tensors,
        data_offset=data_offset,
        file_nbytes=file_nbytes,
    )


def _open_reader(file: Path, file_nbytes: int) -> GGUFReader:
    """``gguf.GGUFReader`` over ``file``, its failures as a ``_Problem``."""
    if file_nbytes == 0:
        raise _Problem(" is not a GGUF file: it is empty")
    reader_class = _bounded_reader_class()
    reader = reader_class.__new__(reader_class)  # kept when __init__ fails, to say why
    try:
        reader.__init__(file)
    except _ShortRead as short:
        raise _Problem(
            f" is truncated: its GGUF header ends at byte {file_nbytes:,}, inside a field "
            f"that reaches byte {short.end:,}"
        ) from None
    except (ValueError, KeyError, IndexError, TypeError, OverflowError, UnicodeError) as exc:
        magic = bytes(reader.data[:4]) if "data" in reader.__dict__ else b""
        if magic != GGUF_MAGIC:
            raise _Problem(f" is not a GGUF file: it starts with {magic!r}, not b'GGUF'") from None
        if "fields" not in reader.__dict__:  # the reader refused the version
            raise _Problem(
                f" is a GGUF version the gguf package cannot read ({exc}); the workbench reads "
                "little-endian GGUF versions 2 and 3"
            ) from exc
        hint = ""
        if "GGMLQuantizationType" in str(exc) or "GGUFValueType" in str(exc):
            hint = "; a newer gguf package may know it (upgrade gguf)"
        raise _Problem(f": the gguf package cannot read its header: {exc}{hint}") from exc
    if reader.byte_order != "I":
        raise _Problem(
            " is a big-endian GGUF; the workbench reads little-endian GGUF versions 2 and 3"
        )
    return reader


@functools.cache
def _bounded_reader_class() -> type[GGUFReader]:
    """``GGUFReader`` that refuses header reads past the end of the file.

    The stock reader slices its memory map, so a header cut short reads as short arrays and
    fails far from the cause (or, for an array claiming billions of items, loops over empty
    reads). Here such a read raises ``_ShortRead``. Once the header is read (``data_offset``
    is set) the reader only maps tensor data, which this module never reads: a tensor past the
    end gets a zero-stride stand-in so the table completes, and ``_cached_header`` names it.
    """
    import numpy as np  # noqa: PLC0415 (numpy only when a header is read)
    from gguf import GGUFReader  # noqa: PLC0415 (gguf is slow to import)

    class BoundedGGUFReader(GGUFReader):
        def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
            count = int(count)
            end = int(offset) + np.dtype(dtype).itemsize * count
            if end <= len(self.data):
                return super()._get(offset, dtype, count, override_order)
            if "data_offset" not in self.__dict__:
                raise _ShortRead(end)
            return np.broadcast_to(np.zeros(1, dtype=dtype), (count,))

    return BoundedGGUFReader


def _field_value(reader_field: ReaderField) -> tuple[Any, int | None]:
    """A header field's value (long arrays as ``"<n items>"``) and, for arrays, their length."""
    from gguf import GGUFValueType  # noqa: PLC0415 (gguf is slow to import)

    kind = reader_field.types[0] if reader_field.types else None
    if kind == GGUFValueType.ARRAY:
        # parts: key length, key, value type, item type, item count, then the items
        count = int(reader_field.parts[4][0])
        if count > _ARRAY_KEEP_LIMIT:
            return f"<{count} items>", count
        if reader_field.types[-1] == GGUFValueType.STRING:
            return [_text(reader_field.parts[i]) for i in reader_field.data], count
        return reader_field.contents(), count
    if kind == GGUFValueType.STRING:
        return _text(reader_field.parts[-1]), None
    return reader_field.contents(), None


def _text(part: Any) -> str:
    return part.tobytes().decode("utf-8", errors="replace")
