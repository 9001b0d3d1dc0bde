"""Compare planning strategies off the GUI thread: one ``Candidate`` per strategy.

``run_comparison`` plans every strategy of a ``PlanRequest`` (captured on the GUI thread) and
predicts each plan's speed; with ``precisions`` the joint planner adds a
``precision+placement`` row (``runtime.precision_session.plan_joint``); warnings the planner raises while planning a strategy are kept with
that strategy's candidate. No widgets here: the planner panel shows the candidates.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, replace
from typing import Any

from workbench.runtime.engine import parse_dtype
from workbench.runtime.load_check import check_load
from workbench.runtime.machine_attention import predict_with_attention
from workbench.runtime.planning import STRATEGIES, plan_opened_model
from workbench.runtime.precision_planning import measured_profile
from workbench.runtime.precision_session import JOINT_STRATEGY, plan_joint

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
    joint: Any = None  # runtime.precision_session.JointOutcome of the precision+placement row


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
    memory: Any = None  # runtime.planning.MemoryOptions: each device's reserve from its layers
    precisions: str = ""  # "int4,int8,bf16": also plan precision and placement together
    min_bits: float | None = None  # the joint planner's least average bits


def run_comparison(request: PlanRequest) -> list[Candidate]:
    """Plan every strategy of ``request`` and predict its speed (runs on a worker thread).

    When ``request.dtype`` differs from the tree's planning dtype, the model's tree is rebuilt
    in that dtype first (``OpenedModel.with_dtype``): the speed prediction then counts the
    bytes the plan counted, and applying the plan carries the dtype to the session. With
    ``precisions`` every row is predicted on ``precision_planning.measured_profile`` (the
    detected profile with this CPU's kernels measured, as the joint row needs them), so the
    rows compare on the same figures.
    """
    if request.precisions and request.profile is not None:
        # the joint row measures this CPU's kernels (once per machine): every row's speed is
        # predicted on the profile that carries them, not the plain rows on the figures before
        request = replace(request, profile=measured_profile(request.profile))
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
                    memory=request.memory,
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
                prediction = predict_with_attention(opened, tree, plan.device_map, request.profile)
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
    if request.precisions:
        candidates.append(joint_candidate(request, sized))
    return candidates


def joint_candidate(request: PlanRequest, opened: Any) -> Candidate:
    """The ``precision+placement`` row: the joint planner over ``request.precisions``."""
    try:
        outcome = plan_joint(
            opened,
            budgets=request.budgets,
            profile=request.profile,
            precisions=request.precisions,
            min_bits=request.min_bits,
            reserve=request.reserve,
            memory=request.memory,
        )
    except ValueError as exc:  # BadInputError: no plan meets the constraints
        return Candidate(JOINT_STRATEGY, error=str(exc))
    check = check_load(opened, outcome.plan.device_map)
    return Candidate(
        JOINT_STRATEGY,
        plan=outcome.plan,
        prediction=outcome.prediction,
        load_check=check,
        joint=outcome,
    )
