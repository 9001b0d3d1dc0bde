"""Safe loading of pickled (``.bin`` / ``.pt``) state dicts.

Pickle can run arbitrary code, so these files are only ever read with
``torch.load(..., weights_only=True)``, which unpickles tensors and plain containers and refuses
everything else. ``mmap=True`` keeps tensor data on disk until it is touched (zip-format files,
torch >= 2.1); legacy-format files fall back to a normal load.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import torch

from workbench.big_modeling.errors import CheckpointError


def load_pickled_state_dict(file: str | Path) -> dict[str, torch.Tensor]:
    """Load a pickled state dict safely, memory-mapped where the format allows.

    Args:
        file: A ``.bin``/``.pt``/``.pth`` file holding ``{name: tensor}``.

    Returns:
        The state dict, tensors on CPU (memory-mapped for zip-format files).

    Raises:
        CheckpointError: the file is a directory, empty, corrupt, not a flat dict of tensors, or
            holds a pickle that tries to run code (refused, never executed).

    Example:
        >>> state = load_pickled_state_dict("pytorch_model.bin")  # doctest: +SKIP
    """
    path = Path(file)
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, expected a pickled state dict file")
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: is empty (0 bytes); re-download or re-save the checkpoint")
    mmap = zipfile.is_zipfile(path)
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"{path}: refused to unpickle: the file holds objects other than tensors (possibly code "
            f"that would run on load). Only weights_only pickles are loaded; convert it to "
            f"safetensors from a trusted source. ({first_line})"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: is not a readable PyTorch checkpoint ({exc})") from None
    if not isinstance(loaded, dict):
        raise CheckpointError(
            f"{path}: holds a {type(loaded).__name__}, expected a dict of tensors"
        )
    bad = sorted(
        str(k)
        for k, v in loaded.items()
        if not isinstance(k, str) or not isinstance(v, torch.Tensor)
    )
    if bad:
        raise CheckpointError(
            f"{path}: entries that are not tensors: {', '.join(bad[:10])}; expected a flat state dict"
        )
    return loaded
