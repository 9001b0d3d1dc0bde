"""``load_checkpoint_in_model`` and ``load_checkpoint_and_dispatch``: streaming, bounded-memory loads.

Signatures follow the reference exactly; ``progress=`` and ``cancel=`` are keyword-only extras.
A load first indexes the checkpoint from its headers and plans every tensor (keys, ties, shapes,
dtypes, devices), so a bad checkpoint fails before anything changes; then it streams tensor by
tensor (see ``workbench.big_modeling.loading.execute``). Peak extra memory is one tensor, not one shard, and nothing calls
``gc.collect``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from workbench.big_modeling.device_map.coverage import check_map_keys
from workbench.big_modeling.device_map.value import normalize_device_map
from workbench.big_modeling.devices import DeviceValue, check_devices_available
from workbench.big_modeling.dispatch import dispatch_model
from workbench.big_modeling.errors import DeviceMapError
from workbench.big_modeling.loading.distributed import broadcast_index, broadcast_source
from workbench.big_modeling.loading.execute import LoadExecutor, LoadResult
from workbench.big_modeling.loading.index import CheckpointIndex
from workbench.big_modeling.loading.offload_staging import OffloadStager
from workbench.big_modeling.loading.plan import (
    parse_dtype,
    plan_load,
    warn_key_differences,
)
from workbench.big_modeling.loading.reader import TensorReader
from workbench.big_modeling.planning.planner import get_balanced_memory, infer_auto_device_map
from workbench.big_modeling.progress import CancelToken, ProgressCallback

logger = logging.getLogger(__name__)

AUTO_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
DeviceMapArg = Mapping[str, DeviceValue] | str | None


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: DeviceMapArg = None,
    offload_folder: str | os.PathLike[str] | None = None,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: list[str] | None = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
    *,
    progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
    mmap: bool = True,
) -> LoadResult:
    """Load a (possibly sharded) checkpoint into ``model``, sending each weight to its device.

    Call ``dispatch_model`` afterwards to make a model spread over devices runnable, or use
    ``load_checkpoint_and_dispatch``.

    Args:
        model: The model, usually built with ``init_empty_weights`` (weights on ``meta``).
        checkpoint: A ``.safetensors`` or ``.bin``/``.pt`` file, a ``*.index.json``, or a folder
            holding ``model.safetensors``, ``pytorch_model.bin`` or one index and its shards.
        device_map: Module name -> device (int, ``"cpu"``, ``"cuda:1"``, ``"disk"``...); the
            longest matching prefix wins. A string (``"auto"``...) computes the map as
            ``load_checkpoint_and_dispatch`` does. ``None``: every tensor loads where the model
            has it (``meta`` -> CPU), into the existing tensor when it is materialised.
        offload_folder: Where ``"disk"`` weights go (required when the map has ``"disk"``).
        dtype: Floating weights are cast to it (integer/bool never). ``None``: each tensor takes
            the model tensor's dtype, as the reference does.
        offload_state_dict: Accepted for compatibility. The reference uses it to avoid holding a
            whole shard plus the CPU state dict; this loader never holds more than one tensor
            beyond the model, so there is nothing to offload and it changes nothing.
        offload_buffers: Also send buffers of ``"disk"`` modules to disk (default: they load to
            CPU, so BatchNorm statistics are always real tensors).
        keep_in_fp32_modules: Modules whose floating weights load as ``float32`` whatever
            ``dtype`` is (matched on whole dotted name components).
        offload_8bit_bnb: bitsandbytes 8-bit offload; not supported (``NotImplementedError``).
        strict: Raise (before loading anything) when keys are missing or unexpected; otherwise
            both are warned about by name.
        full_state_dict: Checkpoint tensors are full (unsharded) tensors; with ``torch.distributed``
            tensors (``DTensor``) in the model, each is sharded to the parameter's placements.
            ``False`` is accepted for plain models (there is nothing to gather).
        broadcast_from_rank0: Needs an initialised process group: rank 0 reads the files and
            broadcasts tensor by tensor; other ranks never open them.
        progress: Keyword-only. Called with ``LoadProgress(bytes_done, bytes_total, tensor_name)``
            after every tensor and every chunk of a larger one (16 MiB read, 16 MiB read and
            cast or written to the offload folder), so well within 100 ms of work.
        cancel: Keyword-only. Checked before every tensor and after every chunk; a cancel raises
            ``LoadCancelled``. Tensors loaded so far stay loaded, untouched ones stay as they were
            (``meta`` for an empty model), and no file of this load is left in the offload folder
            (the folder itself is removed if this load created it). The same holds for any error.
        mmap: Keyword-only. CPU weights that keep their dtype become copy-on-write memory maps
            of their safetensors file: zero copy, pages read on first use and reclaimable by the
            kernel (as ``safetensors``/Accelerate give them). The files must then not be
            rewritten or truncated while the model lives. ``False`` reads every byte now into
            private memory (the load then costs what a raw read of the files costs).

    Returns:
        A ``LoadResult`` (missing/unexpected keys, bytes read and written, offload entries). The
        reference returns ``None``; callers that ignore the value port unchanged.

    Raises:
        CheckpointError: a missing, corrupt or mismatched checkpoint (names file, key, problem).
        DeviceMapError: a malformed map, keys naming no module of ``model`` (raised before
            anything is read), or tensors the map places nowhere.
        OffloadError: ``"disk"`` without a writable ``offload_folder``, or a failed write.
        LoadCancelled: ``cancel`` was set.

    Example:
        >>> with init_empty_weights():  # doctest: +SKIP
        ...     model = MyModel(config)
        >>> load_checkpoint_in_model(model, "ckpt/", device_map={"": "cpu"})  # doctest: +SKIP
    """
    if offload_8bit_bnb:
        raise NotImplementedError(
            "offload_8bit_bnb=True needs bitsandbytes, which workbench does not support"
        )
    if offload_state_dict:
        logger.debug(
            "offload_state_dict=True: streaming already bounds CPU memory; nothing to offload"
        )
    dtype = parse_dtype(dtype)
    if isinstance(device_map, str):
        device_map = auto_device_map(
            model,
            device_map,
            max_memory=None,
            no_split_module_classes=None,
            dtype=dtype,
            offload_buffers=offload_buffers,
        )
    normalized = None if device_map is None else normalize_device_map(device_map)
    if normalized is not None:
        check_map_keys(model, normalized)  # a misspelt key fails before any file is read
        check_devices_available(normalized, allow_meta=True)  # cuda:99 named, not an assert
    if broadcast_from_rank0:
        index = broadcast_index(checkpoint)
        source_factory: Any = lambda: broadcast_source(index, cancel)  # noqa: E731
    else:
        index = CheckpointIndex.from_path(checkpoint)
        source_factory = lambda: TensorReader(index)  # noqa: E731
    plan = plan_load(
        model,
        index,
        device_map=normalized,
        dtype=dtype,
        keep_in_fp32_modules=keep_in_fp32_modules,
        offload_buffers=offload_buffers,
        strict=strict,
    )
    stager = OffloadStager.open(offload_folder) if plan.uses_disk() else None
    warn_key_differences(plan, index.source, model)
    try:
        with source_factory() as source:
            executor = LoadExecutor(
                source, stager=stager, progress=progress, cancel=cancel, mmap=mmap
            )
            executor.full_state_dict = full_state_dict
            result = executor.run(plan)
    except BaseException:
        if stager is not None:
            stager.abort()  # also removes the offload folder if this load created it
        raise
    logger.info(
        "loaded %d tensors (%d B) from %s in %.3f s; %d B written to the offload folder",
        len(plan.steps),
        result.nbytes_read,
        index.source,
        result.load_s,
        result.offload_nbytes_written,
    )
    return result


def auto_device_map(
    model: nn.Module,
    device_map: str,
    *,
    max_memory: Mapping[Any, int | str] | None,
    no_split_module_classes: list[str] | None,
    dtype: torch.dtype | None,
    offload_buffers: bool,
) -> dict[str, DeviceValue]:
    """Compute a map for ``"auto"``/``"balanced"``/``"balanced_low_0"``/``"sequential"``.

    Raises:
        DeviceMapError: any other string.
    """
    if device_map not in AUTO_MAPS:
        raise DeviceMapError(
            f"device_map={device_map!r} is not a map; use a dict or one of {', '.join(AUTO_MAPS)}"
        )
    if device_map != "sequential":
        max_memory = get_balanced_memory(
            model,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            dtype=dtype,
            low_zero=(device_map == "balanced_low_0"),
        )
    return infer_auto_device_map(
        model,
        max_memory=max_memory,
        no_split_module_classes=no_split_module_classes,
        dtype=dtype,
        offload_buffers=offload_buffers,
    )


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: DeviceMapArg = None,
    max_memory: Mapping[Any, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    offload_buffers: bool = False,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool | None = None,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
    *,
    progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
    mmap: bool = True,
    precision_map: Mapping[str, Any] | None = None,
) -> nn.Module:
    """Load a checkpoint into ``model`` along ``device_map`` and attach the hooks that run it.

    Args:
        model: The model (usually on ``meta``).
        checkpoint: As for ``load_checkpoint_in_model``.
        device_map: A dict, or ``"auto"``/``"balanced"``/``"balanced_low_0"``/``"sequential"``
            (computed from ``max_memory`` and ``no_split_module_classes``). ``None``: load only,
            no dispatch.
        max_memory: Device -> budget (``{0: "10GiB", "cpu": "30GiB"}``) for string maps.
        no_split_module_classes: Layer classes never split across devices.
        offload_folder: Folder for ``"disk"`` weights.
        offload_buffers: Offload buffers too on CPU/disk modules.
        dtype: Cast floating weights to this dtype.
        offload_state_dict: Accepted for compatibility (defaults to ``True`` with ``"disk"`` as in
            the reference); streaming makes it unnecessary.
        skip_keys: Input/output keys the hooks must not move.
        preload_module_classes: Classes whose instances load all their weights at forward start.
        force_hooks: Attach hooks even when the map is a single device.
        strict: Refuse missing/unexpected keys.
        full_state_dict: See ``load_checkpoint_in_model``.
        broadcast_from_rank0: See ``load_checkpoint_in_model``.
        progress: Keyword-only progress callback (see ``load_checkpoint_in_model``).
        cancel: Keyword-only cancel token (see ``load_checkpoint_in_model``).
        mmap: Keyword-only; map CPU weights from the files (see ``load_checkpoint_in_model``).
        precision_map: Keyword-only extra: ``{module name: precision}`` (``"int8"``,
            ``"int4-g64"``, ``"bfloat16"``...); after loading, the covered ``nn.Linear`` layers
            are quantized with torchao before dispatch, cpu ones in place and disk ones packed
            once into the offload folder (see ``workbench.big_modeling.quantization.apply``).

    Returns:
        The model, dispatched when ``device_map`` is given.

    Raises:
        CheckpointError, DeviceMapError, OffloadError, LoadCancelled: as for
        ``load_checkpoint_in_model``.

    Example:
        >>> model = load_checkpoint_and_dispatch(  # doctest: +SKIP
        ...     model, "ckpt/", device_map="auto", no_split_module_classes=["LlamaDecoderLayer"]
        ... )
    """
    parsed_dtype = parse_dtype(dtype)
    if isinstance(device_map, str):
        device_map = auto_device_map(
            model,
            device_map,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            dtype=parsed_dtype,
            offload_buffers=offload_buffers,
        )
    if offload_state_dict is None:
        offload_state_dict = (
            device_map is not None and "disk" in normalize_device_map(device_map).values()
        )
    load_checkpoint_in_model(
        model,
        checkpoint,
        device_map=device_map,
        offload_folder=offload_folder,
        dtype=parsed_dtype,
        offload_state_dict=offload_state_dict,
        offload_buffers=offload_buffers,
        strict=strict,
        full_state_dict=full_state_dict,
        broadcast_from_rank0=broadcast_from_rank0,
        progress=progress,
        cancel=cancel,
        mmap=mmap,
    )
    if precision_map is not None:
        from workbench.big_modeling.quantization.apply import quantize_model  # noqa: PLC0415 (torchao is heavy)

        quantize_model(
            model, precision_map, offload_folder=offload_folder, progress=progress, cancel=cancel
        )
    if device_map is None:
        return model
    return dispatch_model(
        model,
        device_map=dict(device_map),
        offload_dir=offload_folder,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
        force_hooks=force_hooks,
    )
