"""Convert a GGUF file into a Hugging Face folder the engine loads like any other.

transformers loads a GGUF by de-quantizing it, but refuses ``save_pretrained`` on the result
("quantized with gguf and is not serializable"), so the conversion writes the folder itself,
with transformers' pieces: ``AutoConfig``/``AutoTokenizer`` with ``gguf_file=`` for the config
and tokenizer, and its GGUF tensor processor (Llama's q/k rows un-permuted) and name mapping
for the weights, de-quantized one tensor at a time by the ``gguf`` package. The folder holds
``config.json`` (without ``quantization_config``), ``generation_config.json``, the tokenizer
files, sharded safetensors with their index, and ``workbench_gguf.json`` naming the source.
``lm_head.weight`` is left out when the config ties it to the embeddings.

The folder lives in the workbench cache under ``gguf/<stem>-<sha256 prefix>``, so a file is
converted once, whatever its path. Work happens in a temporary folder beside it that is renamed
into place at the end: a failed or cancelled conversion leaves nothing behind.

Example:
    >>> folder = convert_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP
    >>> sorted(p.name for p in folder.iterdir())[:3]
    ['config.json', 'generation_config.json', 'model-00001-of-00003.safetensors']
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from workbench.big_modeling.atomic import atomic_write_text
from workbench.big_modeling.dtypes import dtype_name
from workbench.big_modeling.errors import LoadCancelled
from workbench.big_modeling.loading.writer import save_sharded_checkpoint
from workbench.models.cache_dirs import make_readable, workbench_cache_dir
from workbench.models.errors import ModelSourceError
from workbench.models.gguf import (
    CONVERTED_DTYPE,
    GGUFHeader,
    GGUFTensorInfo,
    check_supported,
    gguf_to_hf_names,
    read_gguf_header,
)
from workbench.models.intake import build_empty_model
from workbench.models.warmup import wait_for_warm_up

logger = logging.getLogger(__name__)

# What ``convert_gguf(progress=...)`` reports, in order.
CONVERT_STAGES = (
    "hashing file",
    "reading config",
    "converting tensors",
    "writing shards",
    "writing tokenizer",
)
SOURCE_RECORD = "workbench_gguf.json"
SHARD_TARGET_NBYTES = 128 * 1024 * 1024
_HASH_CHUNK = 8 * 1024 * 1024
_KEY_LENGTH = 16


class Cancellable(Protocol):
    """What ``cancel=`` takes: a ``CancelToken`` or anything with ``cancelled``."""

    @property
    def cancelled(self) -> bool: ...


@dataclass(frozen=True)
class ConvertProgress:
    """One report of a conversion: the stage and how far into it (``done`` of ``total``)."""

    stage: str
    done: int = 0
    total: int = 0

    def describe(self) -> str:
        """``"converting tensors (120 of 272)"`` or just the stage."""
        return f"{self.stage} ({self.done} of {self.total})" if self.total else self.stage


def gguf_cache_root(cache_root: str | os.PathLike[str] | None = None) -> Path:
    """Where converted folders live: ``<workbench cache>/gguf``."""
    return Path(cache_root) if cache_root is not None else workbench_cache_dir() / "gguf"


def file_sha256(
    path: str | os.PathLike[str],
    *,
    cancel: Cancellable | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> str:
    """The hex SHA-256 of a file, read in 8 MiB chunks (``progress(done_bytes, total_bytes)``).

    Raises:
        LoadCancelled: when ``cancel`` is set between chunks.
    """
    digest = hashlib.sha256()
    total = os.path.getsize(path)
    done = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            _check(cancel)
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    return digest.hexdigest()


def converted_folder(
    path: str | os.PathLike[str],
    *,
    cache_root: str | os.PathLike[str] | None = None,
    sha256: str | None = None,
) -> Path:
    """The cache folder a conversion of ``path`` writes (it may not exist yet)."""
    digest = sha256 or file_sha256(path)
    stem = Path(path).name.removesuffix(".gguf")
    return gguf_cache_root(cache_root) / f"{stem}-{digest[:_KEY_LENGTH]}"


def convert_gguf(
    path: str | os.PathLike[str],
    *,
    cache_root: str | os.PathLike[str] | None = None,
    dtype: torch.dtype = CONVERTED_DTYPE,
    progress: Callable[[ConvertProgress], None] | None = None,
    cancel: Cancellable | None = None,
) -> Path:
    """Return the converted folder of a GGUF file, converting it first when it is not cached.

    Args:
        path: the ``.gguf`` file.
        cache_root: the folder holding converted models (default ``gguf_cache_root()``).
        dtype: the floating dtype the weights are written in.
        progress: called with a ``ConvertProgress`` as each stage starts and after each tensor
            and shard (on the calling thread).
        cancel: checked between chunks, tensors and stages.

    Returns:
        The folder (``config.json``, tokenizer, safetensors shards and index).

    Raises:
        ModelSourceError: not a GGUF, an architecture transformers cannot convert (named, with
            the ones it can), or a file transformers fails on.
        LoadCancelled: when ``cancel`` was set; nothing is left on disk.
    """
    source = Path(path).expanduser()
    report = progress or (lambda _: None)
    header = read_gguf_header(source)
    check_supported(header)
    report(ConvertProgress(CONVERT_STAGES[0]))
    digest = file_sha256(source, cancel=cancel)
    target = converted_folder(source, cache_root=cache_root, sha256=digest)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        _convert_into(staging, header, dtype, report, cancel)
        atomic_write_text(
            staging / SOURCE_RECORD,
            json.dumps(
                {"file": source.name, "sha256": digest, "dtype": dtype_name(dtype)}, indent=2
            )
            + "\n",
        )
        _check(cancel)
        make_readable(staging)
        with contextlib.suppress(OSError):  # another process converted it first: keep theirs
            os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not (target / "config.json").is_file():
        raise OSError(f"could not create the converted model in {target}")
    logger.info("converted %s into %s", source, target)
    return target


def _convert_into(
    staging: Path,
    header: GGUFHeader,
    dtype: torch.dtype,
    report: Callable[[ConvertProgress], None],
    cancel: Cancellable | None,
) -> None:
    _check(cancel)
    report(ConvertProgress(CONVERT_STAGES[1]))
    wait_for_warm_up()
    config = _transformers_config(header, dtype)
    model, class_name = build_empty_model(config, header.path)
    _check(cancel)
    state_dict = _convert_tensors(header, model, dtype, report, cancel)
    if getattr(config, "tie_word_embeddings", False):
        state_dict.pop("lm_head.weight", None)
    _check_complete(header, model, state_dict)
    _check(cancel)
    total = sum(t.numel() * t.element_size() for t in state_dict.values())
    shards = max(1, -(-total // SHARD_TARGET_NBYTES))
    report(ConvertProgress(CONVERT_STAGES[3], 0, shards))

    def on_shard(shard: Any) -> None:
        _check(cancel)
        report(ConvertProgress(CONVERT_STAGES[3], shard.shards_done, shard.num_shards))

    save_sharded_checkpoint(state_dict, staging, num_shards=shards, progress=on_shard)
    del state_dict
    _write_config(staging, config, class_name, dtype)
    _check(cancel)
    report(ConvertProgress(CONVERT_STAGES[4]))
    _write_tokenizer(staging, header)


def _transformers_config(header: GGUFHeader, dtype: torch.dtype) -> Any:
    from transformers import AutoConfig  # noqa: PLC0415 (transformers is heavy)

    try:
        config = AutoConfig.from_pretrained(
            str(header.path.parent), gguf_file=header.path.name, local_files_only=True
        )
    except Exception as exc:
        raise ModelSourceError(
            f"{header.path}: transformers could not read the config of this "
            f"{header.architecture} GGUF: {type(exc).__name__}: {exc}"
        ) from exc
    with contextlib.suppress(AttributeError):
        del config.quantization_config
    config.dtype = dtype
    return config


def _tensor_array(header: GGUFHeader, info: GGUFTensorInfo) -> np.ndarray:
    """The tensor's stored bytes as ``(*rows, row_bytes)`` uint8, memory-mapped."""
    rows = info.shape[:-1]
    row_count = int(np.prod(rows)) if rows else 1
    row_nbytes = info.stored_nbytes // max(1, row_count)
    return np.memmap(
        header.path,
        dtype=np.uint8,
        mode="r",
        offset=header.data_offset + info.offset,
        shape=(*rows, row_nbytes),
    )


def _convert_tensors(
    header: GGUFHeader,
    model: torch.nn.Module,
    dtype: torch.dtype,
    report: Callable[[ConvertProgress], None],
    cancel: Cancellable | None,
) -> dict[str, torch.Tensor]:
    from gguf import GGMLQuantizationType, dequantize  # noqa: PLC0415 (gguf imports numpy kernels; only when converting)
    from transformers.modeling_gguf_pytorch_utils import (  # noqa: PLC0415 (transformers is heavy)
        TENSOR_PROCESSORS,
        TensorProcessor,
    )

    config_dict = model.config.to_dict()
    processor = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)(config=config_dict)
    names = gguf_to_hf_names(model, header)
    parsed: dict[str, Any] = {"config": config_dict, "tensors": {}}
    state_dict: dict[str, torch.Tensor] = {}
    total = len(header.tensors)
    report(ConvertProgress(CONVERT_STAGES[2], 0, total))
    for done, info in enumerate(header.tensors, start=1):
        _check(cancel)
        raw = _tensor_array(header, info)
        try:
            weights = dequantize(raw, GGMLQuantizationType[info.quant_type])
        except NotImplementedError as exc:
            raise ModelSourceError(
                f"{header.path}: tensor {info.name!r} is stored as {info.quant_type}, which the "
                f"gguf package cannot de-quantize: {exc}"
            ) from exc
        weights = np.asarray(weights).reshape(info.shape)
        result = processor.process(
            weights=weights, name=info.name, tensor_key_mapping=names, parsed_parameters=parsed
        )
        if result.name in names:
            tensor = torch.from_numpy(np.array(result.weights, copy=True))
            state_dict[names[result.name]] = (
                tensor.to(dtype) if tensor.is_floating_point() else tensor
            )
        report(ConvertProgress(CONVERT_STAGES[2], done, total))
    for name, tensor in parsed["tensors"].items():  # processors that merge tensors (MoE)
        state_dict.setdefault(name, tensor.to(dtype) if tensor.is_floating_point() else tensor)
    return state_dict


def _check_complete(
    header: GGUFHeader, model: torch.nn.Module, state_dict: dict[str, torch.Tensor]
) -> None:
    tied = set()
    if getattr(model.config, "tie_word_embeddings", False):
        tied.add("lm_head.weight")
    missing = sorted(set(model.state_dict(keep_vars=True)) - set(state_dict) - tied)
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise ModelSourceError(
            f"{header.path}: the GGUF gives no weights for {len(missing)} tensors of "
            f"{type(model).__name__}: {shown}"
        )
    shapes = {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()}
    wrong = sorted(n for n, t in state_dict.items() if n in shapes and tuple(t.shape) != shapes[n])
    if wrong:
        raise ModelSourceError(
            f"{header.path}: {len(wrong)} tensors have shapes the config does not give, "
            f"e.g. {wrong[0]} is {tuple(state_dict[wrong[0]].shape)}, expected {shapes[wrong[0]]}"
        )


def _write_config(staging: Path, config: Any, class_name: str, dtype: torch.dtype) -> None:
    data = config.to_dict()
    data.pop("quantization_config", None)
    data.pop("_name_or_path", None)
    data["architectures"] = [class_name]
    data["dtype"] = dtype_name(dtype)
    atomic_write_text(staging / "config.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
    generation = {
        key: data[key]
        for key in ("bos_token_id", "eos_token_id", "pad_token_id")
        if data.get(key) is not None
    }
    atomic_write_text(
        staging / "generation_config.json", json.dumps(generation, indent=2, sort_keys=True) + "\n"
    )


def _write_tokenizer(staging: Path, header: GGUFHeader) -> None:
    from transformers import AutoTokenizer  # noqa: PLC0415 (transformers is heavy)

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(header.path.parent), gguf_file=header.path.name, local_files_only=True
        )
    except Exception as exc:
        raise ModelSourceError(
            f"{header.path}: transformers could not build the tokenizer of this GGUF: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    tokenizer.save_pretrained(str(staging))


def _check(cancel: Cancellable | None) -> None:
    if cancel is not None and cancel.cancelled:
        raise LoadCancelled("the GGUF conversion was cancelled")
