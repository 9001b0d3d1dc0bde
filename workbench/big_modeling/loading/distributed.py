"""``broadcast_from_rank0`` and ``full_state_dict`` with ``torch.distributed``.

With ``broadcast_from_rank0=True`` only rank 0 touches the checkpoint: it indexes the headers and
sends the tensor list (name, dtype, shape) to every rank with one ``broadcast_object_list``; then,
tensor by tensor in the plan's order (identical on every rank, since every rank plans from the
same list), rank 0 reads the bytes and broadcasts them. Other ranks never open a checkpoint file,
so the path they pass need not exist there. A one-element status tensor precedes each tensor so a
read failure or a cancel on rank 0 stops every rank instead of hanging them. Cancel rank 0: other
ranks follow it.

With ``DTensor`` parameters in the model, each full checkpoint tensor is sharded to the
parameter's mesh and placements (``full_state_dict=True``; every rank holds the full tensor, so
no communication is needed).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from workbench.big_modeling.dtypes import dtype_name, to_dtype
from workbench.big_modeling.errors import BadInputError, CheckpointError, LoadCancelled
from workbench.big_modeling.loading.index import CheckpointIndex, TensorInfo
from workbench.big_modeling.loading.reader import TensorReader
from workbench.big_modeling.progress import CancelToken

_OK, _FAILED, _CANCELLED = 0, 1, 2


def is_dtensor(tensor: object) -> bool:
    """True for a ``torch.distributed.tensor.DTensor`` (or a Parameter wrapping one).

    Never imports ``torch.distributed.tensor`` (tens of MB): no DTensor exists until it is.
    """
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def distribute_like(current: Any, full: torch.Tensor, *, full_state_dict: bool) -> Any:
    """Shard the full tensor ``full`` like the ``DTensor`` ``current`` (mesh and placements).

    Raises:
        CheckpointError: ``full_state_dict=False``; safetensors and ``.bin`` files hold full
            tensors, never per-rank shards.
    """
    if not full_state_dict:
        raise CheckpointError(
            "full_state_dict=False expects per-rank shards, but safetensors/.bin checkpoints hold full tensors; "
            "pass full_state_dict=True to shard them to the model's DTensor placements"
        )
    from torch.distributed.tensor import distribute_tensor  # noqa: PLC0415 (tens of MB; only for DTensors)

    return distribute_tensor(
        full.to(current.device_mesh.device_type),
        current.device_mesh,
        current.placements,
        src_data_rank=None,
    )


def _require_group() -> tuple[int, torch.device]:
    if not (dist.is_available() and dist.is_initialized()):
        raise BadInputError(
            "broadcast_from_rank0=True needs an initialised process group; call torch.distributed.init_process_group first"
        )
    backend = dist.get_backend()
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if backend == "nccl"
        else torch.device("cpu")
    )
    return dist.get_rank(), device


def broadcast_index(checkpoint: str | os.PathLike[str]) -> CheckpointIndex:
    """Rank 0 indexes ``checkpoint``; every rank returns an index with the same tensors in order.

    On other ranks the ``TensorInfo.file`` is a placeholder: their bytes come from rank 0.

    Raises:
        CheckpointError: rank 0 could not index the checkpoint (raised on every rank).
    """
    rank, _ = _require_group()
    payload: list[Any] = [None]
    if rank == 0:
        try:
            index = CheckpointIndex.from_path(checkpoint)
            payload[0] = (
                "ok",
                [(i.name, dtype_name(i.dtype), i.shape, i.nbytes) for i in index.tensors.values()],
            )
        except CheckpointError as exc:
            payload[0] = ("error", str(exc))
            dist.broadcast_object_list(payload, src=0)
            raise
        dist.broadcast_object_list(payload, src=0)
        return index
    dist.broadcast_object_list(payload, src=0)
    kind, body = payload[0]
    if kind == "error":
        raise CheckpointError(f"rank 0 could not index the checkpoint: {body}")
    remote = Path(f"<rank 0>:{os.fspath(checkpoint)}")
    tensors = {
        name: TensorInfo(name, remote, to_dtype(dtype), tuple(shape), nbytes)
        for name, dtype, shape, nbytes in body
    }
    return CheckpointIndex(Path(os.fspath(checkpoint)), tensors, ())


class BroadcastSource:
    """A ``ByteSource``: rank 0 reads from files and broadcasts; other ranks receive."""

    local_files = False
    handles_cancel = True  # rank 0 decides; the executor must not stop one rank alone

    def __init__(self, index: CheckpointIndex, cancel: CancelToken | None = None) -> None:
        self.rank, self.comm_device = _require_group()
        self.cancel = cancel
        self.reader = TensorReader(index) if self.rank == 0 else None

    def __enter__(self) -> BroadcastSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.reader is not None:
            self.reader.close()

    def read_into(self, info: TensorInfo, out: torch.Tensor, on_bytes: Any = None) -> None:
        status = torch.zeros(1, dtype=torch.int64, device=self.comm_device)
        failure: BaseException | None = None
        if self.reader is not None:
            try:
                if self.cancel is not None:
                    self.cancel.raise_if_cancelled()
                self.reader.read_into(info, out)
            except LoadCancelled as exc:
                status[0], failure = _CANCELLED, exc
            except Exception as exc:
                status[0], failure = _FAILED, exc
        dist.broadcast(status, src=0)
        code = int(status.item())
        if failure is not None:
            raise failure
        if code == _CANCELLED:
            raise LoadCancelled("cancelled on rank 0")
        if code == _FAILED:
            raise CheckpointError(f"rank 0 failed to read tensor {info.name!r}; see rank 0's error")
        payload = out[: info.nbytes]
        if self.comm_device.type == "cpu":
            dist.broadcast(payload, src=0)
        else:
            staged = payload.to(self.comm_device)
            dist.broadcast(staged, src=0)
            payload.copy_(staged)
        if on_bytes is not None:
            on_bytes(info.nbytes)

    def read_range(self, info: TensorInfo, start: int, out: torch.Tensor) -> None:
        raise NotImplementedError("broadcast sources are read whole; local_files is False")


def broadcast_source(index: CheckpointIndex, cancel: CancelToken | None = None) -> BroadcastSource:
    """The byte source for a ``broadcast_from_rank0`` load; ``cancel`` is honoured on rank 0."""
    return BroadcastSource(index, cancel)
