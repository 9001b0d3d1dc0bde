"""The runtime: the session document, the worker process that holds the dispatched model, the
load / infer / verify jobs, and telemetry. No widgets, no Qt.

- ``session.Session``: the document (source, device map, budgets, profile), plain callbacks.
- ``worker.WorkerHost``: spawns the worker, sends ``protocol`` requests, delivers events.
- ``jobs.JobRunner``: the same jobs in process (CLI ``--in-process``) and in the worker.
- ``telemetry``: ``RingBuffer``, ``MemorySampler``, ``TransferRecorder`` and histories.

- ``engine``: the engine's plain vocabulary (errors, device names, formatting, atomic writes)
  that the GUI and the CLI use; the GUI imports the engine only through here. ``basics``: the
  part of it that imports no torch (errors, cancel token, atomic writes, JSON files).

What the GUI and the CLI share, one implementation each:

- ``planning``: ``plan_opened_model``, ``MemoryOptions`` and ``device_reserves`` (each
  device's KV cache + activation reserve: the planner panel, the lanes and ``workbench
  plan``); ``strategy_compare``: one ``Candidate`` per strategy;
  ``precision_planning``: precision and placement planned together (``--precisions``);
  ``prequantized_planning``: checkpoints stored quantized, planned at their header sizes;
  ``quantization_code``: the ``quantization_config`` of "Copy as code".
- ``map_edits``: device-map arithmetic over a module tree (``MapIndex``, ``move_modules``).
- ``map_code``: the ``from_pretrained`` code for a map, budgets exact ("Copy as code",
  ``--emit-code``).
- ``formatting``: sizes, counts, times and rates as people read them.

Submodules are imported explicitly (``from workbench.runtime.worker import WorkerHost``); the
names of ``engine`` also resolve lazily from the package (``from workbench.runtime import
BadInputError``), so importing this package costs nothing.
"""

from __future__ import annotations

from workbench._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    name: "engine"
    for name in (
        "AS_STORED",
        "DTYPE_CHOICES",
        "DeviceMapReading",
        "Device",
        "DeviceDict",
        "DeviceMap",
        "covering_key",
        "model_record_differences",
        "dtype_name",
        "parse_dtype",
        "ShardCallback",
        "ShardProgress",
        "convert_file_size_to_int",
        "device_label",
        "device_sort_key",
        "format_nbytes",
        "format_param_count",
        "load_device_map",
        "normalize_device",
        "read_device_map",
        "resolve_device_map",
        "save_device_map",
    )
}

_EXPORTS.update(
    dict.fromkeys(
        (
            "BadInputError",
            "CancelToken",
            "CheckpointError",
            "DeviceMapError",
            "LoadCancelled",
            "MemoryBudgetError",
            "OffloadError",
            "atomic_path",
            "atomic_write_bytes",
            "atomic_write_text",
            "parse_json",
            "read_json",
        ),
        "basics",  # no torch: the CLI imports these while it builds its parser
    )
)

__all__ = sorted(_EXPORTS)  # noqa: PLE0605  (the names are the keys above)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
