"""The attention inputs of a speed prediction: the model's layout, and this CPU's measured
times when the profile is this machine.

The speed model counts attention from the model's ``AttentionLayout`` (``models.attention_costs``);
on the machine the app runs on, a CPU layer's attention is timed for its head shape
(``models.attention_probe``: measured by an inference run, then cached). What-if profiles count
FLOPs and bytes: their CPUs are not this one.

Example:
    >>> predict_with_attention(opened, tree, {"": "cpu"}, profile).tokens_per_s  # doctest: +SKIP
    19.4
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from workbench.models.attention_probe import cached_attention_times
from workbench.models.hardware import HardwareProfile
from workbench.models.speed import SpeedPrediction, attention_shapes_for, predict_speed
from workbench.models.tree import ModuleTree
from workbench.runtime.planning import attention_layout_or_none

if TYPE_CHECKING:
    from workbench.models.intake import OpenedModel

__all__ = ["attention_inputs", "predict_with_attention"]


def attention_inputs(
    opened: OpenedModel | None, profile: HardwareProfile, tree: ModuleTree | None = None
) -> dict[str, Any]:
    """``predict_speed``'s ``attention`` and ``attention_times`` for ``opened`` on ``profile``:
    the layout (``None`` without a readable config), and the cached times of its shapes in
    ``tree``'s dtypes (default ``opened.tree``) when ``profile`` is this machine (its matmul
    curve measured here). Nothing is measured."""
    layout = attention_layout_or_none(opened) if opened is not None else None
    times = {}
    if layout is not None and profile.cpu_matmul_curve is not None:
        shapes = attention_shapes_for(tree if tree is not None else opened.tree, layout)
        times = cached_attention_times(shapes, measure_if_missing=False)
    return {"attention": layout, "attention_times": times}


def predict_with_attention(
    opened: OpenedModel | None,
    tree: ModuleTree,
    device_map: Mapping[str, int | str],
    profile: HardwareProfile,
    **options: Any,
) -> SpeedPrediction:
    """``predict_speed(tree, device_map, profile, **options)`` with ``opened``'s attention
    (``attention_inputs``): what the window predicts for the map on screen."""
    return predict_speed(
        tree, device_map, profile, **options, **attention_inputs(opened, profile, tree)
    )
