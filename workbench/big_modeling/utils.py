"""The reference's utility names, where ``accelerate.utils`` has them, so imports port.

``from accelerate.utils import set_module_tensor_to_device`` becomes
``from workbench.big_modeling.utils import set_module_tensor_to_device``. Re-exports only: each
name lives in one engine module (the right column below); nothing here is a second copy.
Names resolve lazily (PEP 562), as in ``workbench.big_modeling``.

Example:
    >>> from workbench.big_modeling.utils import dtype_byte_size
    >>> import torch
    >>> dtype_byte_size(torch.float16)
    2
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    # accelerate.utils.modeling
    "set_module_tensor_to_device": "module_tensors",
    "named_module_tensors": "module_tensors",
    "get_non_persistent_buffers": "module_tensors",
    "retie_parameters": "module_tensors",
    "get_module_size_with_ties": "module_tensors",
    "load_state_dict": "state_dicts",
    "get_state_dict_offloaded_model": "state_dicts",
    "find_tied_parameters": "planning.sizes",
    "compute_module_sizes": "planning.sizes",
    "compute_module_total_buffer_size": "planning.sizes",
    "get_max_layer_size": "planning.sizes",
    "get_max_memory": "planning.sizes",
    "dtype_byte_size": "planning.sizes",
    "convert_file_size_to_int": "planning.sizes",
    "get_balanced_memory": "planning.planner",
    "infer_auto_device_map": "planning.planner",
    "check_device_map": "device_map.coverage",
    "clean_device_map": "device_map.value",
    "load_checkpoint_in_model": "loading.api",
    "has_offloaded_params": "hooks.align",
    "align_module_device": "hooks.align",
    # accelerate.utils.offload
    "extract_submodules_state_dict": "state_dicts",
    "offload_weight": "offload.folder",
    "offload_state_dict": "offload.folder",
    "load_offloaded_weight": "offload.folder",
    "OffloadedWeightsLoader": "offload.folder",
    "PrefixedDataset": "offload.folder",
    # accelerate.utils.constants
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING": "constants",
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605  (the names are the keys above)


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"workbench.big_modeling.{module_name}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
