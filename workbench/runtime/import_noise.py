"""Quiet the warnings libraries log on import about what this machine cannot use.

When transformers imports its torchao quantizer, torchao logs "Failed to load ..._C_mxfp8...so"
for its CUDA-only kernels and torch's pytree logs a deprecation for torchao's enums. The CLI and
the worker process call ``quiet_import_noise``; ``workbench -v`` leaves them on.
"""

from __future__ import annotations

import logging

IMPORT_NOISE_LOGGERS = ("torchao", "torch.utils._pytree")
"""The loggers set to ERROR."""


def quiet_import_noise() -> None:
    """Set the import-noise loggers to ERROR (their real errors still show)."""
    for name in IMPORT_NOISE_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
