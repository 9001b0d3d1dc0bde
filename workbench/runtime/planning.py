"""Planning a device map for an opened model: the one path the planner panel and
``workbench plan`` share. No widgets here.

``plan_opened_model`` plans with the sizes the model's tree reports (checkpoint headers when
there are weights), so a plan's totals and the tree agree even for a checkpoint mixing dtypes;
``activation_reserve`` is the memory kept free for a prefill of a given shape.

Example:
    >>> opened = open_model("demo")  # doctest: +SKIP
    >>> plan = plan_opened_model(opened, max_memory={"cpu": 2**30}, strategy="auto")
    >>> sum(plan.per_device_bytes.values()) == opened.tree.root.nbytes
    True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

import torch

from workbench.big_modeling import PlanResult, estimate_activation_reserve, plan_device_map

if TYPE_CHECKING:
    from workbench.models.intake import OpenedModel

STRATEGIES: Final = ("auto", "balanced", "balanced_low_0", "sequential")

AS_OPENED: Final = "as opened"
"""``dtype=`` of ``plan_opened_model`` meaning "the dtype ``opened`` was opened in"."""


def planning_dtype(opened: OpenedModel) -> torch.dtype | None:
    """The dtype weights are planned in: the one the model was opened in, else the checkpoint's
    one floating dtype, else the config's declared one (``None`` when none of these says)."""
    if opened.planning_dtype is not None:
        return opened.planning_dtype
    if opened.checkpoint is None:
        return opened.declared_dtype
    stored = list(opened.checkpoint.dtype_nbytes())
    floating = [dtype for dtype in stored if dtype.is_floating_point]
    return floating[0] if len(floating) == 1 else None


def _planner_dtype(opened: OpenedModel) -> torch.dtype | None:
    """The ``dtype=`` for the planner: ``None`` when the meta model already has the stored
    dtype, so buffers keep their own size, as the tree counts them."""
    dtype = planning_dtype(opened)
    if opened.planning_dtype is None:
        param = next(opened.model.parameters(), None)
        if param is not None and param.dtype == dtype:
            return None
    return dtype


def plan_opened_model(
    opened: OpenedModel,
    *,
    max_memory: Mapping[int | str, int],
    strategy: str = "auto",
    reserve: Mapping[int | str, int] | None = None,
    no_split: Iterable[str] | None = None,
    dtype: str | torch.dtype | None = AS_OPENED,
) -> PlanResult:
    """Plan ``opened`` for the budgets ``max_memory`` with the sizes its tree reports.

    Args:
        reserve: bytes kept free per device for activations (empty or ``None``: none).
        no_split: module classes never split across devices; ``None``: the model's own.
        dtype: the dtype the planner counts weights in; ``AS_OPENED`` (the default): the one
            ``opened`` was opened in, or as stored; ``None``: the meta model's own.

    Raises:
        BadInputError: an unknown strategy or bad budgets.
        MemoryBudgetError: the model does not fit the budgets.
    """
    return plan_device_map(
        opened.model,
        max_memory=dict(max_memory),
        strategy=strategy,  # type: ignore[arg-type]
        no_split_module_classes=list(opened.no_split_modules if no_split is None else no_split),
        dtype=_planner_dtype(opened) if dtype == AS_OPENED else dtype,
        reserve=dict(reserve) if reserve else None,
        # A what-if config has no stored sizes: the planner's lazy index is faster there.
        module_sizes=opened.module_sizes() if opened.has_weights else None,
    )


def activation_reserve(
    opened: OpenedModel, batch: int, sequence: int, dtype: Any = AS_OPENED
) -> int:
    """The bytes a prefill of ``batch`` x ``sequence`` tokens needs for activations.

    Args:
        dtype: the activations' dtype; ``AS_OPENED``: the weights' ``planning_dtype``.

    Raises:
        ValueError, TypeError, AttributeError: the config lacks what the estimate needs.
    """
    if dtype == AS_OPENED:
        dtype = planning_dtype(opened)
    return int(estimate_activation_reserve(opened.config, batch, sequence, dtype))
