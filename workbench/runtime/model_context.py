"""Everything the window derives from one opened model, held in one object.

A ``ModelContext`` is created when the user opens a model and replaced whole when they open
another one: the planner's comparison, the reserve that goes with the model and the worker model
loaded for it all live here, so nothing computed for the previous model can be shown for the new
one. The session holds the current context (``Session.context``); views keep the context they
show and reset themselves when the session's is another object. What carries over between
models is explicit and lives outside: the hardware profile (``Session.profile``).

Plain Python, no Qt.

Example:
    >>> first = ModelContext("demo", opened=None, generation=1)
    >>> second = ModelContext("llama-405b", opened=None, generation=2)
    >>> first.comparison is None and second.loaded is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Comparison:
    """One planner comparison: what was asked and one candidate per strategy.

    Attributes:
        request: the ``PlanRequest`` the comparison ran (budgets, reserve, dtype, strategies).
        candidates: one ``Candidate`` per strategy, in the order planned.
        profile_name: the hardware profile the comparison was made for.
        budgets: the session's budgets when it was made (a later change makes it stale).
    """

    request: Any
    candidates: tuple[Any, ...]
    profile_name: str | None
    budgets: Mapping[int | str, int] = field(default_factory=dict)

    def candidate(self, strategy: str) -> Any | None:
        """Return the candidate of ``strategy`` or ``None``."""
        return next((c for c in self.candidates if c.strategy == strategy), None)


@dataclass(frozen=True)
class LoadedModelRef:
    """The worker model loaded for a context: its source and the map it was loaded along."""

    source: str
    device_map: Mapping[str, int | str]
    summary: Any = None  # workbench.runtime.protocol.LoadSummary


class ModelContext:
    """The state that belongs to one opened model.

    Args:
        source: what the user opened (a config.json, a folder, ``hf-cache:REPO``).
        opened: the ``workbench.models.OpenedModel``; a planning-dtype switch replaces it with
            the same model re-sized (``Session.set_opened``), the context stays.
        generation: increases with every model the session opens (1 for the first).

    Attributes:
        comparison: the planner's last ``Comparison`` for this model, or ``None``.
        loaded: the worker model loaded for this model, or ``None``.
    """

    def __init__(self, source: str, opened: Any, *, generation: int) -> None:
        self.source = str(source)
        self.opened = opened
        self.generation = int(generation)
        self.comparison: Comparison | None = None
        self.loaded: LoadedModelRef | None = None

    @property
    def tree(self) -> Any:
        """The opened model's ``ModuleTree`` (``None`` without a model)."""
        return None if self.opened is None else self.opened.tree

    def __repr__(self) -> str:
        loaded = "loaded" if self.loaded is not None else "not loaded"
        return f"ModelContext({self.source!r}, generation={self.generation}, {loaded})"
