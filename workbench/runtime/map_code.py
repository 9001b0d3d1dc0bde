"""The ``from_pretrained(device_map=..., max_memory=...)`` code that loads a model along a
device map: the one writer behind the GUI's "Copy as code" and ``workbench plan --emit-code``.

Budgets are written so that transformers (accelerate) parses them back to the same bytes,
every device's, disk included: ``"24GiB"``, ``"2000GB"``, else the exact int.

Example:
    >>> print(from_pretrained_code(model_class="GPT2LMHeadModel", location="gpt2",
    ...     device_map={"": "cpu"}, max_memory={"cpu": 2**30}))  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.models.catalog import hub_repo_id
from workbench.models.hf_cache import HF_CACHE_PREFIX
from workbench.runtime.engine import dtype_name

if TYPE_CHECKING:
    import torch

__all__ = ["checkpoint_location", "format_budget", "from_pretrained_code"]

PLACEHOLDER = "path/to/checkpoint"

_BUDGET_UNITS = (("GiB", 2**30), ("GB", 10**9), ("MiB", 2**20), ("MB", 10**6))


def format_budget(nbytes: int) -> str | int:
    """A budget ``from_pretrained(max_memory=...)`` parses back to the same bytes.

    accelerate reads only GiB/MiB/KiB/GB/MB/KB (no TiB/TB) and rejects a bare digit string, so
    a size no unit divides stays an int.

    Example:
        >>> format_budget(24 * 2**30), format_budget(2 * 10**12), format_budget(1234567891)
        ('24GiB', '2000GB', 1234567891)
    """
    for unit, factor in _BUDGET_UNITS:
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor}{unit}"
    return int(nbytes)


def checkpoint_location(
    source: str | None, folder: str | os.PathLike[str] | None
) -> tuple[str, str | None]:
    """Where ``from_pretrained`` finds the weights, and a comment when that is a placeholder.

    The model folder, except for an ``hf-cache:`` source, whose Hub repo id travels better;
    else the Hub repo id of a bundled config; else ``"path/to/checkpoint"`` with a comment
    saying what to put there.
    """
    source = source or ""
    if folder is not None and not source.startswith(HF_CACHE_PREFIX):
        return os.fspath(folder), None
    repo_id = hub_repo_id(source) if source else None
    if repo_id is not None:
        return repo_id, None
    if folder is not None:
        return os.fspath(folder), None
    if source:
        return (
            PLACEHOLDER,
            f"# {source} holds no weights: put its Hub repo id or weights folder here",
        )
    return PLACEHOLDER, "# put the model's Hub repo id or weights folder here"


def from_pretrained_code(
    *,
    model_class: str,
    location: str | Path,
    device_map: Mapping[str, int | str],
    max_memory: Mapping[int | str, int],
    dtype: torch.dtype | None = None,
    placeholder: str | None = None,
    quantization: list[str] | None = None,
) -> str:
    """Return Python that loads ``model_class`` from ``location`` along ``device_map``.

    Args:
        max_memory: the budgets in bytes, every device's (disk included); each is written
            with ``format_budget``, so the code asks for exactly these bytes.
        dtype: the dtype to load in (``torch`` is imported only then); ``None``: as stored.
        placeholder: a comment line put above ``location`` (see ``checkpoint_location``).
        quantization: lines defining ``quantization_config`` (from
            ``runtime.quantization_code.quantization_config_code``), passed to the call.

    A comment says that transformers needs ``accelerate`` to load along a device map; a map
    with ``"disk"`` entries names an ``offload_folder``.
    """
    memory = {device: format_budget(nbytes) for device, nbytes in max_memory.items()}
    lines = ["import torch"] if dtype is not None else []
    lines += [
        f"from transformers import {model_class}",
        "# from_pretrained(device_map=...) needs accelerate: python3 -m pip install accelerate",
        "",
        f"device_map = {_py_dict(dict(device_map))}",
        f"max_memory = {_py_dict(memory)}",
        *(quantization or []),
        f"model = {model_class}.from_pretrained(",
    ]
    if placeholder:
        lines.append(f"    {placeholder}")
    lines += [
        f"    {os.fspath(location)!r},",
        "    device_map=device_map,",
        "    max_memory=max_memory,",
    ]
    if "disk" in device_map.values():
        lines.append('    offload_folder="offload",')
    if dtype is not None:
        lines.append(f"    dtype=torch.{dtype_name(dtype)},")
    if quantization:
        lines.append("    quantization_config=quantization_config,")
    lines.append(")")
    return "\n".join(lines) + "\n"


def _py_dict(mapping: dict[Any, Any]) -> str:
    """A dict literal: on one line up to three entries, else one entry per line."""
    if len(mapping) <= 3:
        return repr(mapping)
    body = "".join(f"    {key!r}: {value!r},\n" for key, value in mapping.items())
    return "{\n" + body + "}"
