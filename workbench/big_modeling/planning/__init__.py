"""Planning: how many bytes each module takes, and which device each module goes to.

Modules, lowest first (each imports only those above it in this list):

- ``dtype_sizes``: bytes per element of each dtype, and the dtype names size accounting accepts.
- ``module_index``: ``ModuleIndex``, the one-pass preorder index of a module tree (sizes,
  subtree ranges, names on demand), public and documented for size accounting and the planner.
- ``sizes``: the public size accounting (``compute_module_sizes``, ``get_max_memory``,
  ``convert_file_size_to_int``, ``format_nbytes`` ...).
- ``subtree_stats``: bulk statistics of module subtrees (C-level passes).
- ``on_demand_index``: ``LazyModuleIndex``, the index the planner runs on, numbering modules
  only where the planner looks; ``build_planner_index`` picks it or the eager index.
- ``largest_layer``: the largest layer still to place (a max segment tree).
- ``charges``: bytes that travel with a module (a layer's KV cache) through the planner.
- ``placement``: the greedy placement pass (``run_placement``).
- ``planner``: the public API (``infer_auto_device_map``, ``get_balanced_memory``,
  ``plan_device_map``, ``PlanResult``, ``Placement``).
- ``attention_kinds``: each decoder layer's attention kind read from a transformers config.
- ``kv_cache``: KV cache bytes per layer by attention kind (exact against transformers caches).
- ``activation_peak``: prefill and decode activation peaks.
- ``device_reserve``: ``reserve_per_device``, KV cache plus activations per device, with "why".
- ``activation_reserve``: ``estimate_activation_reserve``, the one-device figure of that model.

Import names from their module (or from ``workbench.big_modeling``); this package file is empty
so that importing one module does not import the others.
"""
