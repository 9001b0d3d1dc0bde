"""Open a GGUF file (what llama.cpp and LM Studio users have on disk) for planning.

``read_gguf_header`` (``workbench.models.gguf_header``) reads the header only. ``open_gguf``
builds the transformers model it describes with empty weights; its tree counts each tensor's
GGUF bytes as ``stored_nbytes`` and the bytes once converted to a torch dtype (``bfloat16`` by
default) as ``nbytes``, so planning works from the header alone. Loading needs the file
converted first (``workbench.models.gguf_convert.convert_gguf``; the load job does it).

Example:
    >>> opened = open_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP
    >>> opened.tree.root.stored_nbytes, opened.tree.root.nbytes  # Q4_1/Q8_0 file, bf16 model
    (96577024, 269030144)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from workbench.models.dtypes import parse_dtype
from workbench.models.errors import ModelSourceError
from workbench.models.gguf_header import (
    GGUF_SUFFIX,
    GGUFHeader,
    GGUFTensorInfo,
    is_gguf_path,
    read_gguf_header,
)
from workbench.models.warmup import wait_for_warm_up

__all__ = [
    "CONVERTED_DTYPE",
    "GGUF_SUFFIX",
    "GGUFHeader",
    "GGUFTensorInfo",
    "check_supported",
    "gguf_config_dict",
    "gguf_to_hf_names",
    "is_gguf_path",
    "open_gguf",
    "read_gguf_header",
    "supported_architectures",
]

logger = logging.getLogger(__name__)

CONVERTED_DTYPE = torch.bfloat16
_ARCH_TO_MODEL_TYPE = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
    "gemma3": "gemma3_text",
    "command-r": "cohere",
}


def supported_architectures() -> list[str]:
    """The GGUF architectures transformers can convert, sorted."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    return sorted(GGUF_CONFIG_MAPPING)


def check_supported(header: GGUFHeader) -> None:
    """Raise unless transformers can convert ``header.architecture``.

    Raises:
        ModelSourceError: naming the architecture and the ones transformers supports.
    """
    supported = supported_architectures()
    if header.architecture not in supported:
        raise ModelSourceError(
            f"{header.path}: GGUF architecture {header.architecture!r} cannot be converted by "
            f"this transformers; it converts {', '.join(supported)}. "
            "Use a GGUF of one of those or a Hugging Face folder of the model."
        )


def gguf_config_dict(header: GGUFHeader, dtype: torch.dtype = CONVERTED_DTYPE) -> dict[str, Any]:
    """The Hugging Face ``config.json`` values the header describes (transformers' renames).

    Raises:
        ModelSourceError: an architecture transformers cannot convert.
    """
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    check_supported(header)
    arch = header.architecture
    renames = GGUF_CONFIG_MAPPING[arch]
    data: dict[str, Any] = dict(GGUF_CONFIG_DEFAULTS_MAPPING.get(arch, {}))
    for key, value in header.hyper_parameters().items():
        target = renames.get(key)
        if target is not None and target != -1 and not isinstance(value, str):
            data[target] = value
    data["model_type"] = _ARCH_TO_MODEL_TYPE.get(arch, arch)
    data.setdefault("vocab_size", header.array_lengths.get("tokenizer.ggml.tokens"))
    if data["vocab_size"] is None:
        data.pop("vocab_size")
    names = {t.name for t in header.tensors}
    data["tie_word_embeddings"] = "output.weight" not in names or arch in ("falcon", "bloom")
    for key in ("bos", "eos", "padding", "unknown"):
        value = header.fields.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(value, int):
            target = {"padding": "pad", "unknown": "unk"}.get(key, key)
            data[f"{target}_token_id"] = value
    data["dtype"] = str(dtype).removeprefix("torch.")
    return data


def gguf_to_hf_names(model: torch.nn.Module, header: GGUFHeader) -> dict[str, str]:
    """Map the header's tensor names to the model's state-dict names.

    The mapping is transformers' (``get_gguf_hf_weights_map``: gguf's tensor-name table, tried
    on each name and on its suffixes below every module), with the table built once instead of
    once per module (397 times, a minute of CPU, for a 30-layer Llama).
    """
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    processor_class = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)
    processor = processor_class(config=model.config.to_dict())
    arch = next((k for k, v in MODEL_ARCH_NAMES.items() if v == header.architecture), None)
    if arch is None:
        raise ModelSourceError(
            f"{header.path}: the gguf package has no tensor names for {header.architecture!r}; "
            "upgrade gguf"
        )
    name_map = get_tensor_name_map(arch, int(model.config.num_hidden_layers))
    wanted = {t.name for t in header.tensors}
    mapping: dict[str, str] = {}
    for hf_name in model.state_dict(keep_vars=True):
        name, dot, suffix = processor.preprocess_name(hf_name).rpartition(".")
        if suffix not in ("weight", "bias"):
            name, dot, suffix = f"{name}{dot}{suffix}", "", ""
        parts = name.split(".")
        for start in range(len(parts)):
            gguf_name = name_map.get_name(".".join(parts[start:]))
            if gguf_name is not None:
                key = f"{gguf_name}{dot}{suffix}"
                if key in wanted:
                    mapping.setdefault(key, hf_name)
                break
    return mapping


def open_gguf(
    path: str | os.PathLike[str],
    *,
    dtype: str | torch.dtype | None = None,
    progress: Callable[[str], None] | None = None,
) -> Any:
    """Open a ``.gguf`` file as an empty-weight model for planning (see the module docs).

    Args:
        path: the GGUF file.
        dtype: the torch dtype planning counts floating weights in; ``None`` means the dtype
            the conversion writes (``bfloat16``).
        progress: called with each stage of ``intake.OPEN_STAGES`` as it starts.

    Returns:
        An ``OpenedModel`` with ``gguf`` set to the header, ``checkpoint`` ``None`` (the file
        is not loadable as it is) and a tree whose ``stored_nbytes`` are the GGUF's bytes.

    Raises:
        ModelSourceError: not a GGUF, a corrupt header, or an architecture transformers
            cannot convert.
    """
    import time

    from workbench.models.intake import (
        OPEN_STAGES,
        OpenedModel,
        _tied_aliases,
        _tree_for,
        build_config,
        build_empty_model,
    )

    stage = progress or (lambda _: None)
    planning = parse_dtype(dtype) or CONVERTED_DTYPE
    stage(OPEN_STAGES[0])
    header = read_gguf_header(path)
    data = gguf_config_dict(header, planning if planning.is_floating_point else CONVERTED_DTYPE)
    wait_for_warm_up()
    config = build_config(data, header.path)
    stage(OPEN_STAGES[1])
    start = time.perf_counter()
    model, class_name = build_empty_model(config, header.path)
    build_s = time.perf_counter() - start
    stage(OPEN_STAGES[3])
    names = gguf_to_hf_names(model, header)
    by_name = {t.name: t for t in header.tensors}
    stored = {hf: by_name[g].stored_nbytes for g, hf in names.items()}
    no_split = sorted(getattr(model, "_no_split_modules", None) or [])
    tree = _tree_for(model, None, planning, no_split, stored)
    unmapped = sorted(set(by_name) - set(names))
    if unmapped:
        logger.warning(
            "%s: %d GGUF tensors have no place in %s: %s",
            header.path,
            len(unmapped),
            class_name,
            ", ".join(unmapped[:5]),
        )
    tied = {name for group in tree.tied_groups for name in group}
    expected = set(model.state_dict(keep_vars=True))
    missing = sorted(name for name in expected - set(stored) if name not in tied)
    return OpenedModel(
        source=os.fspath(path),
        config=config,
        model=model,
        checkpoint=None,
        no_split_modules=no_split,
        tied_groups=tree.tied_groups,
        declared_dtype=planning,
        tree=tree,
        config_path=None,
        model_class=class_name,
        planning_dtype=planning,
        tied_weight_keys=_tied_aliases(tree),
        missing_keys=missing,
        unexpected_keys=unmapped,
        build_s=build_s,
        gguf=header,
        gguf_nbytes=stored,
    )
