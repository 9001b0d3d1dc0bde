"""The engine's vocabulary that the GUI and the CLI share: errors, device names, byte and
parameter formatting, atomic file writes, JSON reading and device-map files.

The GUI reaches the engine only through the runtime; this module is where the plain names it
needs (no tensors) come from. Everything here is defined in ``workbench.big_modeling``; the
names that import no torch live in ``basics`` instead (``workbench.runtime`` exports both).
"""

from __future__ import annotations

from workbench.big_modeling.device_map.coverage import resolve_device_map
from workbench.big_modeling.device_map.files import (
    DeviceMapReading,
    load_device_map,
    model_record_differences,
    read_device_map,
    save_device_map,
)
from workbench.big_modeling.device_map.value import DeviceMap, covering_key
from workbench.big_modeling.devices import (
    Device,
    DeviceDict,
    device_label,
    device_sort_key,
    normalize_device,
)
from workbench.big_modeling.dtypes import AS_STORED, DTYPE_CHOICES, dtype_name, parse_dtype
from workbench.big_modeling.loading.writer import ShardCallback, ShardProgress
from workbench.big_modeling.planning.sizes import (
    convert_file_size_to_int,
    format_nbytes,
    format_param_count,
)

__all__ = [
    "AS_STORED",
    "DTYPE_CHOICES",
    "Device",
    "DeviceDict",
    "DeviceMap",
    "DeviceMapReading",
    "ShardCallback",
    "ShardProgress",
    "convert_file_size_to_int",
    "covering_key",
    "device_label",
    "device_sort_key",
    "dtype_name",
    "format_nbytes",
    "format_param_count",
    "load_device_map",
    "model_record_differences",
    "normalize_device",
    "parse_dtype",
    "read_device_map",
    "resolve_device_map",
    "save_device_map",
]
