"""The engine names that cost no torch to import: its errors, the cancel token, atomic file
writes and JSON reading. The CLI imports these while it builds its parser (``workbench
--help`` stays fast); ``workbench.runtime`` exports them with the rest of ``engine``.
"""

from __future__ import annotations

from workbench.big_modeling.atomic import atomic_path, atomic_write_bytes, atomic_write_text
from workbench.big_modeling.errors import (
    BadInputError,
    CheckpointError,
    DeviceMapError,
    LoadCancelled,
    MemoryBudgetError,
    OffloadError,
)
from workbench.big_modeling.json_files import parse_json, read_json
from workbench.big_modeling.progress import CancelToken

__all__ = [
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
]
