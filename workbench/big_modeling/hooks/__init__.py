"""Hooks around a module's forward: the base protocol, device alignment, casting, CPU offload.

Modules:

- ``base``: ``ModelHook``, ``SequentialHook``, attaching and removing hooks (the forward wrapper).
- ``align``: ``AlignDevicesHook`` (inputs and weights on the execution device) and the questions
  about one module's offloaded tensors (``has_offloaded_params``, ``align_module_device``).
- ``attach``: the walkers that put ``AlignDevicesHook`` on a model's modules.
- ``tensor_slots``: a module's tensor entries and the cheap swaps the hooks make on them.
- ``io_moves``: moving nested inputs and outputs to a device.
- ``events``: transfer events of the alignment hook.
- ``casting`` (+ ``casting_kernels``, ``casting_scratch``): layerwise casting hooks.
- ``cpu_offload``: whole-model offload hooks for pipelines (``CpuOffload``, ``UserCpuOffloadHook``).
- ``prefetch`` (+ ``prefetch_reader``): fetch the next offloaded module's weights during compute.

Import the names from their module (the public ones are also in ``workbench.big_modeling``).
"""
