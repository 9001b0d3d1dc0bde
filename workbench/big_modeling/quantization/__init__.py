"""Quantization-aware planning and loading (issue 19).

- ``precisions``: the one precision vocabulary (``int8``, ``int4-g128``, ``nf4``, ``fp8``, the
  model's own dtypes), parsed once where a name enters, like ``dtypes`` for torch dtypes.
- ``sizes``: bytes of a weight per precision, exact to the torchao / bitsandbytes layouts, and
  a precision map applied to a model's tensors and modules.
- ``keep_high_precision``: the modules left unquantized by default (transformers' quantizers').
- ``apply``: quantize a loaded model per a precision map; ``backends`` picks the library per
  precision and device (torchao CPU/CUDA layouts), ``bnb4`` holds nf4/fp4 (bitsandbytes),
  ``bnb4_cpu`` and ``int8_cpu`` run nf4/fp4 and int8 CPU matmuls through the per-thread
  ``dense_buffers`` (no per-call copies to fragment the heap),
  ``experts`` / ``expert_layout`` the fused 3-D MoE expert weights, ``packed`` the offload
  folder's records of quantized weights.
- ``prequantized``: GPTQ / AWQ / compressed-tensors / bitsandbytes checkpoints sized from their
  headers, with their ``quantization_config``.

The joint planner is ``workbench.big_modeling.planning.precision_planner``.
"""

CPU_KERNELS_REVISION = 2
"""The revision of this package's own CPU matmul paths (``bnb4_cpu``, ``int8_cpu``); a CPU
kernel measurement is cached under it (``models.device_probe.cpu_kernels_entry_key``), so a
change to those paths is measured again. Raise it with each change to their speed.
Revision 2: ``int8_cpu`` (int8 through one reused buffer, not torchao's per-call cast)."""
