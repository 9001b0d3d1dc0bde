"""One place that finds the files under ``resources/``: from a source checkout, an installed
wheel (packaged as ``workbench._resources``) or a PyInstaller bundle."""

from __future__ import annotations

import sys
from functools import cache
from importlib import resources as importlib_resources
from pathlib import Path


@cache
def resources_root() -> Path:
    """Return the folder holding icons, configs, hardware profiles and styles."""
    frozen_root = getattr(sys, "_MEIPASS", None)
    if frozen_root is not None:
        return Path(frozen_root) / "resources"
    source_root = Path(__file__).resolve().parent.parent / "resources"
    if source_root.is_dir():
        return source_root
    return Path(str(importlib_resources.files("workbench._resources")))


def resource_path(*parts: str) -> Path:
    """Return the path of a bundled resource, e.g. ``resource_path("configs", "gpt2.json")``.

    Raises:
        FileNotFoundError: when the resource does not exist.
    """
    path = resources_root().joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(
            f"bundled resource {'/'.join(parts)!r} not found under {resources_root()}"
        )
    return path
