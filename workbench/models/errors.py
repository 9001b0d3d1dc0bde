"""Errors raised while opening models, making demos and reading hardware profiles."""

from __future__ import annotations

from workbench.big_modeling.errors import BadInputError


class ModelSourceError(BadInputError):
    """A model source the user can fix: no config, unknown ``model_type``, missing fields,
    a class transformers cannot build, or a cached repo id that is not in the cache."""


class ProfileError(BadInputError):
    """A hardware profile that does not exist or is malformed."""
