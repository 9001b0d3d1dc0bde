"""Keyword names of a transformers model's forward that changed between releases.

Example:
    >>> cache_argument(model)  # doctest: +SKIP
    ('cache', 'cache')
"""

from __future__ import annotations

import inspect

import torch

__all__ = ["cache_argument"]


def cache_argument(model: torch.nn.Module) -> tuple[str, str]:
    """The forward's KV-cache keyword and the output's cache attribute.

    transformers 5.x renamed ``past_key_values`` to ``cache``; older releases keep the old name.
    """
    try:
        params = inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        params = {}
    if "cache" in params:
        return "cache", "cache"
    return "past_key_values", "past_key_values"
