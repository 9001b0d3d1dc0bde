"""Compare planning strategies off the GUI thread: one ``Candidate`` per strategy.

``run_comparison`` plans every strategy of a ``PlanRequest`` (captured on the GUI thread) and
predicts each plan's speed; warnings the planner raises while planning a strategy are kept with
that strategy's candidate. No widgets here: the planner panel shows the candidates.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

from workbench.models.speed import predict_speed
from workbench.runtime.engine import parse_dtype
from workbench.runtime.load_check import check_load
from workbench.runtime.planning import STRATEGIES, plan_opened_model

__all__ = ["STRATEGIES", "Candidate", "PlanRequest", "run_comparison"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """One strategy's outcome: the plan (or the error) and its predicted speed."""

    strategy: str
    plan: Any = None  # PlanResult
    prediction: Any = None  # SpeedPrediction
    error: str = ""
    opened: Any = None  # the model re-sized in the planning dtype, when it differs from the tree's
    warnings: tuple[str, ...] = ()  # what the planner warned about while planning this one
    load_check: Any = None  # workbench.runtime.load_check.LoadCheck of the plan's map


@dataclass(frozen=True)
class PlanRequest:
    """Everything one comparison needs, captured on the GUI thread."""

    model: Any
    tree: Any
    profile: Any
    budgets: dict[Any, int]
    reserve: dict[Any, int]
    dtype: str | None
    no_split: list[str]
    strategies: tuple[str, ...]
    opened: Any  # the session's OpenedModel (re-sized when ``dtype`` differs)


def run_comparison(request: PlanRequest) -> list[Candidate]:
    """Plan every strategy of ``request`` and predict its speed (runs on a worker thread).

    When ``request.dtype`` differs from the tree's planning dtype, the model's tree is rebuilt
    in that dtype first (``OpenedModel.with_dtype``): the speed prediction then counts the
    bytes the plan counted, and applying the plan carries the dtype to the session.
    """
    tree, resized = request.tree, None
    opened = request.opened
    if parse_dtype(request.dtype) != opened.planning_dtype:
        resized = opened.with_dtype(request.dtype)
        tree = resized.tree
    sized = resized or opened  # with weights, plan the bytes the checkpoint headers give
    candidates = []
    for strategy in request.strategies:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # every candidate reports its own, not only the first
            try:
                plan = plan_opened_model(
                    sized,
                    max_memory=request.budgets,
                    strategy=strategy,
                    no_split=request.no_split,
                    dtype=request.dtype,
                    reserve=request.reserve,
                )
            except ValueError as exc:  # BadInputError / MemoryBudgetError: shown in the column
                plan, error = None, str(exc)
        noted = tuple(dict.fromkeys(str(w.message) for w in caught))
        for text in noted:
            logger.warning("%s plan: %s", strategy, text)
        if plan is None:
            candidates.append(Candidate(strategy, error=error, warnings=noted))
            continue
        prediction = None
        if request.profile is not None:
            try:
                prediction = predict_speed(tree, plan.device_map, request.profile)
            except ValueError as exc:
                logger.info("no speed prediction for %s: %s", strategy, str(exc))
        check = check_load(opened, plan.device_map)
        candidates.append(
            Candidate(
                strategy,
                plan=plan,
                prediction=prediction,
                opened=resized,
                warnings=noted,
                load_check=check,
            )
        )
    return candidates
