"""Torchao quantized weights as plain tensors plus a small JSON record, and back.

A torchao weight (``Int8Tensor``, ``Int4OpaqueTensor``, ``Float8Tensor``) is a wrapper tensor
subclass: it reports the original shape and dtype (``bfloat16[4096, 4096]``) but its bytes live in
inner tensors (``qdata`` int8/uint8, ``scale``, ``zero_point``/``scale_and_zero``). PyTorch's
wrapper-subclass protocol (``__tensor_flatten__`` / ``__tensor_unflatten__``, the one
``torch.compile`` and FSDP use) names those inner tensors and the plain attributes needed to
rebuild the wrapper. This module turns a wrapper into ``{inner name: tensor}`` plus a JSON record
of the attributes, so the offload folder can store the packed bytes as ordinary safetensors, and
rebuilds the wrapper from them. Only the classes in ``PACKED_CLASSES`` are rebuilt (a record
never names arbitrary code to import), and only JSON-plain attribute values, dtypes, sizes and
the enums in ``_ENUMS`` are stored.

Example:
    >>> import torch
    >>> from torchao.quantization import Int8WeightOnlyConfig, quantize_  # doctest: +SKIP
    >>> layer = torch.nn.Linear(64, 32, dtype=torch.bfloat16)  # doctest: +SKIP
    >>> quantize_(layer, Int8WeightOnlyConfig())  # doctest: +SKIP
    >>> inner, record = flatten_packed(layer.weight)  # doctest: +SKIP
    >>> sorted(inner), record["type"]  # doctest: +SKIP
    (['qdata', 'scale', 'zero_point'], 'Int8Tensor')
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import torch
from torchao.prototype.quantization.int4 import Int4OpaqueTensor
from torchao.quantization import Float8Tensor, Int8Tensor
from torchao.quantization.quantize_.common import KernelPreference
from torchao.utils import TorchAOBaseTensor

from workbench.big_modeling.dtypes import dtype_name, lookup_dtype
from workbench.big_modeling.errors import CheckpointError
from workbench.big_modeling.quantization.bnb4 import Bnb4bitTensor
from workbench.big_modeling.quantization.experts import Int4ExpertsTensor

PACKED_CLASSES: dict[str, type[torch.Tensor]] = {
    "Int8Tensor": Int8Tensor,
    "Int4OpaqueTensor": Int4OpaqueTensor,
    "Float8Tensor": Float8Tensor,
    "Bnb4bitTensor": Bnb4bitTensor,
    "Int4ExpertsTensor": Int4ExpertsTensor,
}
"""The weight classes a record may name (what ``apply`` produces on CPU): torchao's, and this
package's nf4/fp4 (``bnb4``) and stacked int4 experts (``experts``) wrappers."""

_ENUMS: dict[str, type[enum.Enum]] = {"KernelPreference": KernelPreference}


def is_packed(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is one of the torchao weight classes this module stores."""
    return type(tensor).__name__ in PACKED_CLASSES and isinstance(
        tensor, PACKED_CLASSES[type(tensor).__name__]
    )


def inner_tensors(tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """The plain tensors holding a packed weight's bytes (``{"qdata": ..., "scale": ...}``)."""
    names, _attributes = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
    return {name: getattr(tensor, name) for name in names}


def stored_nbytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor really holds: the sum over its inner tensors for a packed weight.

    The wrapper's own ``untyped_storage()`` reports the *unquantized* size (numel x 2 for a
    bf16-looking int4 weight), so memory is always counted from the inner tensors; ``meta``
    tensors hold 0 bytes.

    Example:
        >>> stored_nbytes(torch.zeros(4, 4, dtype=torch.bfloat16))  # 16 * 2 B
        32
    """
    if is_packed(tensor) or isinstance(tensor, TorchAOBaseTensor):  # CUDA layouts too
        return sum(stored_nbytes(inner) for inner in inner_tensors(tensor).values())
    if tensor.device.type == "meta":
        return 0
    # not untyped_storage(): a memory-mapped checkpoint tensor's storage is its whole shard
    return tensor.numel() * tensor.element_size()


def _encode(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum) and type(value).__name__ in _ENUMS:
        return {"enum": type(value).__name__, "value": value.value}
    if isinstance(value, torch.dtype):
        return {"dtype": dtype_name(value)}
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if isinstance(value, tuple):
        return {"tuple": [_encode(item, where) for item in value]}
    if isinstance(value, list):
        return [_encode(item, where) for item in value]
    raise CheckpointError(
        f"{where}: attribute value {value!r} ({type(value).__name__}) cannot be stored in an "
        "offload record; keep this module on cpu or in a plain dtype."
    )


def _decode(value: Any, where: str) -> Any:
    if isinstance(value, list):
        return [_decode(item, where) for item in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"tuple"} and isinstance(value["tuple"], list):
        return tuple(_decode(item, where) for item in value["tuple"])
    if set(value) == {"size"} and isinstance(value["size"], list):
        return torch.Size(value["size"])
    if set(value) == {"dtype"} and (dtype := lookup_dtype(value["dtype"])) is not None:
        return dtype
    if set(value) == {"enum", "value"} and value["enum"] in _ENUMS:
        return _ENUMS[value["enum"]](value["value"])
    raise CheckpointError(f"{where}: unreadable attribute value {value!r}; quantize again.")


def flatten_packed(
    tensor: torch.Tensor, *, where: str = "packed weight"
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split a packed weight into its inner tensors and a JSON-plain record.

    Args:
        tensor: a torchao weight of a class in ``PACKED_CLASSES``.
        where: names the weight in errors.

    Returns:
        ``({inner name: contiguous CPU tensor}, {"type", "dtype", "shape", "attributes"})``.

    Raises:
        CheckpointError: the class is not one of ``PACKED_CLASSES`` or an attribute is not storable.
    """
    if not is_packed(tensor):
        raise CheckpointError(
            f"{where}: {type(tensor).__name__} is not a packed weight this workbench can store; "
            f"expected one of {', '.join(sorted(PACKED_CLASSES))}."
        )
    names, attributes = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
    inner = {name: getattr(tensor, name).detach().contiguous() for name in names}
    record = {
        "type": type(tensor).__name__,
        "dtype": dtype_name(tensor.dtype),
        "shape": list(tensor.shape),
        "attributes": {key: _encode(value, where) for key, value in attributes.items()},
    }
    return inner, record


def rebuild_packed(
    record: Mapping[str, Any], inner: Mapping[str, torch.Tensor], *, where: str
) -> torch.Tensor:
    """The packed weight ``flatten_packed`` split, rebuilt from its record and inner tensors.

    Args:
        record: the record (``type``, ``dtype``, ``shape``, ``attributes``).
        inner: the inner tensors by name (lazily read ones are fine; each is read once here).
        where: names the record in errors (``"offload/index.json: entry 'h.1.fc.weight'"``).

    Returns:
        The torchao weight, reporting ``record["dtype"]`` and ``record["shape"]``.

    Raises:
        CheckpointError: an unknown class, missing inner tensors, or a shape that does not match.
    """
    cls = PACKED_CLASSES.get(str(record.get("type")))
    if cls is None:
        raise CheckpointError(
            f"{where}: packed type {record.get('type')!r} is not one of "
            f"{', '.join(sorted(PACKED_CLASSES))}; quantize the weights again."
        )
    required = list(cls.tensor_data_names)  # type: ignore[attr-defined]
    missing = sorted(name for name in required if name not in inner)
    if missing:
        raise CheckpointError(f"{where}: packed {cls.__name__} lacks {', '.join(missing)}.")
    attributes = {
        key: _decode(value, where) for key, value in dict(record.get("attributes", {})).items()
    }
    shape = torch.Size(record["shape"])
    rebuilt = cls.__tensor_unflatten__(  # type: ignore[attr-defined]
        dict(inner.items()), attributes, shape, None
    )
    dtype = lookup_dtype(record.get("dtype"))
    if rebuilt.shape != shape or (dtype is not None and rebuilt.dtype != dtype):
        raise CheckpointError(
            f"{where}: rebuilt {cls.__name__} is {dtype_name(rebuilt.dtype)}"
            f"{list(rebuilt.shape)}, the record says {record.get('dtype')}{list(shape)}; "
            "quantize the weights again."
        )
    return rebuilt


def read_packed_entry(
    key: str, info: Mapping[str, Any], weights: Mapping[str, torch.Tensor], *, where: str
) -> torch.Tensor:
    """Rebuild the packed weight an offload index entry's ``"torchao"`` record describes.

    Args:
        key: the weight's name in the index.
        info: its entry (``{"dtype", "shape", "torchao": {"type", "attributes", "tensors"}}``).
        weights: the offload folder's lazy mapping; each inner tensor is read from it by the key
            the record names (plain pointer entries into the packed safetensors file).
        where: names the index in errors.

    Raises:
        CheckpointError: a malformed record, a missing inner entry, or a mismatched shape.
    """
    record = info["torchao"]
    here = f"{where}: entry {key!r}"
    tensors = record.get("tensors") if isinstance(record, Mapping) else None
    if not isinstance(tensors, Mapping) or not all(isinstance(v, str) for v in tensors.values()):
        raise CheckpointError(f"{here}: the torchao record needs a 'tensors' object of key names.")
    missing = sorted(inner_key for inner_key in tensors.values() if inner_key not in weights)
    if missing:
        raise CheckpointError(
            f"{here}: the offload folder lacks {', '.join(missing)}; quantize the weights again."
        )
    inner = {name: weights[inner_key] for name, inner_key in tensors.items()}
    full = {**record, "dtype": info["dtype"], "shape": info["shape"]}
    return rebuild_packed(full, inner, where=here)
