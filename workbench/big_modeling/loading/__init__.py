"""Checkpoint loading: read a checkpoint's index and bytes, plan the load, carry it out.

Modules, each depending only on those above it:

- ``safetensors_header``, ``pickled``: parse one weight file safely (headers only, or a
  ``weights_only`` pickle);
- ``index``: ``CheckpointIndex``/``TensorInfo``, every tensor of a checkpoint from headers;
- ``reader``: ``TensorReader`` and ``iter_checkpoint_tensors``, the bytes of indexed tensors;
- ``plan``: ``plan_load``, the load decided before anything changes;
- ``distributed``: ``broadcast_from_rank0`` and ``DTensor`` sharding;
- ``offload_staging``: ``OffloadStager``, all-or-nothing writes of a load's disk tier into an
  offload folder;
- ``execute``: ``LoadExecutor``, the plan carried out tensor by tensor;
- ``api``: ``load_checkpoint_in_model`` and ``load_checkpoint_and_dispatch``;
- ``writer``: ``save_sharded_checkpoint``.

The public names are exported from ``workbench.big_modeling``.
"""
