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
    "compute_module_sizes": "planning.sizes",
    "compute_module_total_buffer_size": "planning.sizes",
    "get_max_layer_size": "planning.sizes",
    "find_tied_parameters": "planning.sizes",
    "dtype_byte_size": "planning.sizes",
    "convert_file_size_to_int": "planning.sizes",
    "get_max_memory": "planning.sizes",
    "format_nbytes": "planning.sizes",
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
    "infer_auto_device_map": "planning.planner",
    "get_balanced_memory": "planning.planner",
    "plan_device_map": "planning.planner",
    "PlanResult": "planning.planner",
    "Placement": "planning.planner",
    "estimate_activation_reserve": "planning.activation_reserve",
    # device maps
    "check_device_map": "device_map.coverage",
    "clean_device_map": "device_map.value",
    "save_device_map": "device_map.files",
    "load_device_map": "device_map.files",
    "resolve_device_map": "device_map.coverage",
    # hooks
    "ModelHook": "hooks.base",
    "SequentialHook": "hooks.base",
    "add_hook_to_module": "hooks.base",
    "remove_hook_from_module": "hooks.base",
    "remove_hook_from_submodules": "hooks.base",
    "AlignDevicesHook": "hooks.align",
    "attach_execution_device_hook": "hooks.attach",
    "attach_align_device_hook": "hooks.attach",
    "attach_align_device_hook_on_blocks": "hooks.attach",
    "has_offloaded_params": "hooks.align",
    "align_module_device": "hooks.align",
    "LayerwiseCastingHook": "hooks.casting",
    "attach_layerwise_casting_hooks": "hooks.casting",
    # dispatch and offload
    "dispatch_model": "dispatch",
    "cpu_offload": "dispatch",
    "cpu_offload_with_hook": "hooks.cpu_offload",
    "CpuOffload": "hooks.cpu_offload",
    "UserCpuOffloadHook": "hooks.cpu_offload",
    "disk_offload": "dispatch",
    "enable_prefetch": "hooks.prefetch",
    "disable_prefetch": "hooks.prefetch",
    "OffloadedWeightsLoader": "offload.folder",
    "PrefixedDataset": "offload.folder",
    "offload_state_dict": "offload.folder",
    "offload_weight": "offload.folder",
    "load_offloaded_weight": "offload.folder",
    # checkpoints
    "CheckpointIndex": "loading.index",
    "TensorInfo": "loading.index",
    "iter_checkpoint_tensors": "loading.reader",
    "LoadResult": "loading.execute",
    "load_checkpoint_in_model": "loading.api",
    "load_checkpoint_and_dispatch": "loading.api",
    "save_sharded_checkpoint": "loading.writer",
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
