"""What a GGUF file (what llama.cpp and LM Studio users have on disk) means to transformers:
the config it describes and the state-dict name of each of its tensors.

``read_gguf_header`` (``workbench.models.gguf_header``) reads the header only;
``workbench.models.intake.open_gguf`` builds the model from it for planning, and
``workbench.models.gguf_convert.convert_gguf`` converts the file so that it can be loaded.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from workbench.big_modeling.dtypes import dtype_name
from workbench.models.errors import ModelSourceError
from workbench.models.gguf_header import (
    GGUF_SUFFIX,
    GGUFHeader,
    GGUFTensorInfo,
    is_gguf_path,
    read_gguf_header,
)

__all__ = [
    "CONVERTED_DTYPE",
    "GGUF_SUFFIX",
    "GGUFHeader",
    "GGUFTensorInfo",
    "check_supported",
    "gguf_config_dict",
    "gguf_to_hf_names",
    "is_gguf_path",
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
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING  # noqa: PLC0415 (transformers is heavy)

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
    from transformers.integrations.ggml import (  # noqa: PLC0415 (transformers is heavy)
        GGUF_CONFIG_DEFAULTS_MAPPING,
        GGUF_CONFIG_MAPPING,
    )

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
    data["dtype"] = dtype_name(dtype)
    return data


def gguf_to_hf_names(model: torch.nn.Module, header: GGUFHeader) -> dict[str, str]:
    """Map the header's tensor names to the model's state-dict names.

    The mapping is transformers' (``get_gguf_hf_weights_map``: gguf's tensor-name table, tried
    on each name and on its suffixes below every module), with the table built once instead of
    once per module (397 times, a minute of CPU, for a 30-layer Llama).
    """
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map  # noqa: PLC0415 (gguf is optional at import time)
    from transformers.modeling_gguf_pytorch_utils import (  # noqa: PLC0415 (transformers is heavy)
        TENSOR_PROCESSORS,
        TensorProcessor,
    )

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
