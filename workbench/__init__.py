"""Model Memory Workbench: plan, load and watch PyTorch models too big for one device."""

from __future__ import annotations

__version__ = "0.1.0"

APP_NAME = "Model Memory Workbench"
APP_ID = (
    "io.github.model_memory_workbench"  # also the .desktop file name and Windows AppUserModelID
)

__all__ = ["APP_ID", "APP_NAME", "__version__"]
