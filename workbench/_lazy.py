"""PEP 562 lazy re-exports: a package names what it exports and from which submodule; each
name is imported on first use, so importing the package costs nothing (no torch, transformers
or Qt until a name is used)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    namespace: dict[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return the ``__getattr__`` and ``__dir__`` of a package whose ``globals()`` is
    ``namespace`` and which exports ``name -> submodule`` as listed in ``exports``.

    Example:
        >>> __getattr__, __dir__ = lazy_exports(globals(), {"open_model": "intake"})  # doctest: +SKIP
    """
    package = namespace["__name__"]

    def module_getattr(name: str) -> Any:
        module_name = exports.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module_name}"), name)
        namespace[name] = value
        return value

    def module_dir() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return module_getattr, module_dir
