"""Offloaded weights on disk: the folder format, its lazy reader, and memory maps of its files.

Modules:

- ``folder``: the offload folder format (``index.json`` plus raw files): writing
  (``offload_weight``, ``offload_state_dict``), reading (``load_offloaded_weight``) and the lazy
  ``Mapping`` views over it (``OffloadedWeightsLoader``, ``PrefixedDataset``).
- ``mapped_files``: memory maps of raw offload files kept open within a byte budget.

A load's staged writes into an offload folder live with the loader
(``workbench.big_modeling.loading.offload_staging``).

Import the names from their module (the public ones are also in ``workbench.big_modeling``).
"""
