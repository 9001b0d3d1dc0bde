"""The big-model engine: the API of Accelerate's "big modeling" reference, implemented anew.

Code written for that API ports by changing the import::

    from workbench.big_modeling import init_empty_weights, load_checkpoint_and_dispatch

Names resolve lazily (PEP 562), so importing the package costs nothing until a name is used.
"""

from __future__ import annotations

from workbench._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    # empty-weight initialisation
    "init_empty_weights": "empty_init",
    "init_on_device": "empty_init",
    # size accounting
    "compute_module_sizes": "sizes",
    "compute_module_total_buffer_size": "sizes",
    "get_max_layer_size": "sizes",
    "find_tied_parameters": "sizes",
    "dtype_byte_size": "sizes",
    "convert_file_size_to_int": "sizes",
    "get_max_memory": "sizes",
    "format_nbytes": "sizes",
    "get_module_size_with_ties": "module_tensors",
    # tensors and state dicts (the reference's accelerate.utils names)
    "set_module_tensor_to_device": "module_tensors",
    "named_module_tensors": "module_tensors",
    "get_non_persistent_buffers": "module_tensors",
    "retie_parameters": "module_tensors",
    "load_state_dict": "state_dicts",
    "get_state_dict_offloaded_model": "state_dicts",
    "extract_submodules_state_dict": "state_dicts",
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING": "constants",
    # planning
    "infer_auto_device_map": "planner",
    "get_balanced_memory": "planner",
    "plan_device_map": "planner",
    "PlanResult": "planner",
    "Placement": "planner",
    "estimate_activation_reserve": "reserve",
    # device maps
    "check_device_map": "device_map",
    "clean_device_map": "device_map",
    "save_device_map": "device_map",
    "load_device_map": "device_map",
    "resolve_device_map": "device_map",
    # hooks
    "ModelHook": "hooks",
    "SequentialHook": "hooks",
    "add_hook_to_module": "hooks",
    "remove_hook_from_module": "hooks",
    "remove_hook_from_submodules": "hooks",
    "AlignDevicesHook": "alignment",
    "attach_execution_device_hook": "alignment",
    "attach_align_device_hook": "alignment",
    "attach_align_device_hook_on_blocks": "alignment",
    "has_offloaded_params": "alignment",
    "align_module_device": "alignment",
    "LayerwiseCastingHook": "casting",
    "attach_layerwise_casting_hooks": "casting",
    # dispatch and offload
    "dispatch_model": "dispatch",
    "cpu_offload": "dispatch",
    "cpu_offload_with_hook": "dispatch",
    "CpuOffload": "offload_hooks",
    "UserCpuOffloadHook": "offload_hooks",
    "disk_offload": "dispatch",
    "enable_prefetch": "prefetch",
    "disable_prefetch": "prefetch",
    "OffloadedWeightsLoader": "offload_loader",
    "PrefixedDataset": "offload_loader",
    "offload_state_dict": "offload",
    "offload_weight": "offload",
    "load_offloaded_weight": "offload",
    # checkpoints
    "CheckpointIndex": "checkpoint",
    "TensorInfo": "checkpoint",
    "iter_checkpoint_tensors": "checkpoint",
    "LoadResult": "load_exec",
    "load_checkpoint_in_model": "loading",
    "load_checkpoint_and_dispatch": "loading",
    "save_sharded_checkpoint": "shards",
    # progress, events, errors, devices
    "CancelToken": "progress",
    "LoadProgress": "progress",
    "TransferEvent": "transfers",
    "recording_transfers": "transfers",
    "BadInputError": "errors",
    "CheckpointError": "errors",
    "DeviceMapError": "errors",
    "MemoryBudgetError": "errors",
    "OffloadError": "errors",
    "LoadCancelled": "errors",
    "normalize_device": "devices",
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605  (the names are the keys above)


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
