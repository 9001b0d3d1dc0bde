"""Read checkpoint tensors one at a time, straight into their destination memory.

Safetensors data is read with ``os.preadv`` into the destination tensor's own buffer: no
intermediate copy, no ``mmap`` of the shard. That matters for memory: pages of a memory-mapped
shard count towards the process's RSS until the mapping is closed, so ``safe_open`` + ``get_tensor``
over a shard grows RSS by up to the whole shard; a ``pread`` leaves them in the kernel's page cache
only. Peak extra RSS is therefore the destination tensors themselves plus, when a cast is needed,
one staging buffer of the largest cast tensor.

Pickled ``.bin`` files are loaded memory-mapped (``weights_only=True``) one file at a time.

Example:
    >>> for name, tensor in iter_checkpoint_tensors("ckpt/"):  # doctest: +SKIP
    ...     print(name, tensor.shape)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch

from workbench.big_modeling.errors import CheckpointError
from workbench.big_modeling.loading.index import CheckpointIndex, TensorInfo
from workbench.big_modeling.loading.pickled import load_pickled_state_dict

# Large tensors are read in chunks so progress and cancel stay responsive: 16 MiB is ~3 ms from
# the page cache and ~55 ms from a 300 MB/s disk (64 MiB was ~220 ms). Warm 1.5 GB reads take the
# same time at 4, 8, 16, 32 and 64 MiB chunks (6.0-6.6 GB/s, within run-to-run noise).
READ_CHUNK_NBYTES = 16 * 1024 * 1024

BytesCallback = Callable[[int], None]


def empty_bytes(nbytes: int, *, pin_memory: bool = False) -> torch.Tensor:
    """An uninitialised CPU ``uint8`` buffer of ``nbytes`` bytes."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin_memory)


def view_as(buffer: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Reinterpret the first bytes of a ``uint8`` buffer as a tensor of ``dtype`` and ``shape``."""
    nbytes = dtype.itemsize
    for dim in shape:
        nbytes *= dim
    flat = buffer[:nbytes]
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=buffer.device)
    return flat.view(dtype).reshape(shape)


class TensorReader:
    """Reads tensors of one ``CheckpointIndex``, keeping at most one file open per kind.

    Use as a context manager; ``close()`` releases file descriptors and the mapped ``.bin``.
    """

    local_files = True  # the files are readable here, so offload entries may point into them

    def __init__(self, index: CheckpointIndex) -> None:
        self.index = index
        self._fd_file: Path | None = None
        self._fd: int | None = None
        self._pickled_file: Path | None = None
        self._pickled: dict[str, torch.Tensor] = {}
        self._maps: dict[Path, torch.Tensor] = {}

    def __enter__(self) -> TensorReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._fd_file = None, None
        self._pickled, self._pickled_file = {}, None
        self._maps = {}  # tensors mapped from these files keep their own mapping alive

    def map(self, info: TensorInfo) -> torch.Tensor | None:
        """A copy-on-write memory map of ``info``'s bytes as a tensor (zero copy), if possible.

        The whole file is mapped once (``MAP_PRIVATE`` through ``torch.from_file``); pages are
        read on first touch and stay reclaimable page cache until written. Returns ``None`` for
        pickled tensors and for offsets not aligned to the dtype (then read with ``read_into``).
        The file must not be truncated or rewritten while the tensor is alive.

        Raises:
            CheckpointError: the file shrank since it was indexed.
        """
        if not info.is_safetensors:
            return None
        if info.nbytes == 0:
            return torch.empty(info.shape, dtype=info.dtype)
        start = info.file_offset
        if start % info.dtype.itemsize:
            return None
        mapped = self._maps.get(info.file)
        if mapped is None:
            try:
                size = info.file.stat().st_size
                mapped = torch.from_file(str(info.file), shared=False, size=size, dtype=torch.uint8)
            except (OSError, RuntimeError) as exc:
                raise CheckpointError(f"{info.file}: cannot be memory-mapped ({exc})") from exc
            self._maps[info.file] = mapped
        if start + info.nbytes > mapped.numel():
            raise CheckpointError(
                f"{info.file}: ends before tensor {info.name!r}; the file was truncated after it was indexed"
            )
        return mapped[start : start + info.nbytes].view(info.dtype).reshape(info.shape)

    def read_into(
        self, info: TensorInfo, out: torch.Tensor, on_bytes: BytesCallback | None = None
    ) -> None:
        """Fill the CPU ``uint8`` tensor ``out`` (``info.nbytes`` long) with the stored bytes.

        Raises:
            CheckpointError: the file shrank or cannot be read since it was indexed.
        """
        if info.is_safetensors:
            self._pread_into(info, out, on_bytes)
            return
        source = self._pickled_tensor(info)
        if source.dtype != info.dtype or tuple(source.shape) != info.shape:
            raise CheckpointError(f"{info.file}: tensor {info.name!r} changed since it was indexed")
        if info.nbytes:
            out[: info.nbytes].view(info.dtype).view(source.shape).copy_(source)
        if on_bytes is not None:
            on_bytes(info.nbytes)

    def read(self, info: TensorInfo) -> torch.Tensor:
        """Return a new CPU tensor holding ``info``'s data as stored."""
        buffer = empty_bytes(info.nbytes)
        self.read_into(info, buffer)
        return view_as(buffer, info.dtype, info.shape)

    def read_range(self, info: TensorInfo, start: int, out: torch.Tensor) -> None:
        """Fill the ``uint8`` tensor ``out`` with ``info``'s bytes ``[start, start + len(out))``.

        For chunked uploads (safetensors only; ``.bin`` tensors are copied whole).
        """
        if not info.is_safetensors:
            whole = self.read(info).reshape(-1).view(torch.uint8)
            out.copy_(whole[start : start + out.numel()])
            return
        self._pread(info, start, out.numel(), memoryview(out.numpy()), None)

    def _pread_into(
        self, info: TensorInfo, out: torch.Tensor, on_bytes: BytesCallback | None
    ) -> None:
        view = memoryview(out[: info.nbytes].numpy()) if info.nbytes else memoryview(b"")
        self._pread(info, 0, info.nbytes, view, on_bytes)

    def _pread(
        self,
        info: TensorInfo,
        start: int,
        nbytes: int,
        view: memoryview,
        on_bytes: BytesCallback | None,
    ) -> None:
        fd = self._open(info.file)
        offset, done = info.file_offset + start, 0
        while done < nbytes:
            step = min(READ_CHUNK_NBYTES, nbytes - done)
            try:
                got = os.preadv(fd, [view[done : done + step]], offset + done)
            except OSError as exc:
                raise CheckpointError(
                    f"{info.file}: reading tensor {info.name!r} failed ({exc})"
                ) from exc
            if got == 0:
                raise CheckpointError(
                    f"{info.file}: ended while reading tensor {info.name!r} "
                    f"({start + done} of {info.nbytes} bytes); the file was truncated after it was indexed"
                )
            done += got
            if on_bytes is not None:
                on_bytes(got)

    def _open(self, file: Path) -> int:
        if self._fd_file != file:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            try:
                self._fd = os.open(file, os.O_RDONLY)
            except OSError as exc:
                raise CheckpointError(f"{file}: cannot be opened ({exc.strerror})") from exc
            self._fd_file = file
        assert self._fd is not None
        return self._fd

    def _pickled_tensor(self, info: TensorInfo) -> torch.Tensor:
        if self._pickled_file != info.file:
            self._pickled = {}  # drop the previous file's mapping before mapping the next
            self._pickled = load_pickled_state_dict(info.file)
            self._pickled_file = info.file
        try:
            return self._pickled[info.name]
        except KeyError:
            raise CheckpointError(
                f"{info.file}: tensor {info.name!r} vanished since it was indexed"
            ) from None


def iter_checkpoint_tensors(
    checkpoint: str | os.PathLike[str] | CheckpointIndex,
    names: Iterable[str] | None = None,
    *,
    dtype: torch.dtype | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` one tensor at a time, in file order, each a fresh CPU tensor.

    Only one tensor (plus, for ``.bin``, one memory-mapped file) is held at a time by the
    generator; what the caller keeps is up to the caller.

    Args:
        checkpoint: A path accepted by ``CheckpointIndex.from_path`` or an index.
        names: Only these tensors (default: all).
        dtype: Cast floating tensors to this dtype; integer and bool tensors are never cast.

    Raises:
        CheckpointError: an unknown name in ``names``, or a corrupt file.

    Example:
        >>> sizes = {n: t.numel() for n, t in iter_checkpoint_tensors("model.safetensors")}  # doctest: +SKIP
    """
    index = (
        checkpoint
        if isinstance(checkpoint, CheckpointIndex)
        else CheckpointIndex.from_path(checkpoint)
    )
    if names is None:
        infos = list(index.tensors.values())
    else:
        wanted = set(names)
        unknown = sorted(wanted - set(index.tensors))
        if unknown:
            raise CheckpointError(f"{index.source}: no tensors named {', '.join(unknown[:10])}")
        infos = [info for name, info in index.tensors.items() if name in wanted]
    with TensorReader(index) as reader:
        for info in infos:
            tensor = reader.read(info)
            if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
                tensor = tensor.to(dtype)
            yield info.name, tensor
