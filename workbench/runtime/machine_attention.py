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
from workbench.runtime.memory_prediction import main_device
from workbench.runtime.planning import attention_layout_or_none

if TYPE_CHECKING:
    from workbench.models.intake import OpenedModel

__all__ = [
    "ATTENTION_ESTIMATED",
    "attention_estimated",
    "attention_inputs",
    "predict_on_screen",
    "predict_with_attention",
]

ATTENTION_ESTIMATED = (
    "attention estimated from its FLOPs: this CPU has not run this model's attention shapes "
    "yet (an inference run times them)"
)
"""Said beside a prediction for this machine whose CPU attention shapes are not timed yet."""


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


def attention_estimated(
    opened: OpenedModel | None,
    tree: ModuleTree,
    device_map: Mapping[str, int | str],
    profile: HardwareProfile,
) -> bool:
    """Whether a prediction for ``profile`` counts attention this CPU has not timed: the
    profile is this machine's (its matmul curve measured here), ``device_map`` runs on the CPU,
    and some of the model's attention shapes have no cached times (``attention_probe``: an
    inference run measures them; until then the speed model counts their FLOPs and bytes,
    which predicted a 60M float16 Llama at 114 tok/s where it was 81.5 with its attention
    timed). Nothing is measured."""
    if opened is None or profile.cpu_matmul_curve is None or main_device(device_map) != "cpu":
        return False
    layout = attention_layout_or_none(opened)
    if layout is None:
        return False
    shapes = attention_shapes_for(tree, layout)
    found = cached_attention_times(shapes, measure_if_missing=False)
    return len(found) < len({shape.key for shape in shapes})


def predict_on_screen(
    opened: OpenedModel | None,
    tree: ModuleTree,
    device_map: Mapping[str, int | str],
    profile: HardwareProfile,
    **options: Any,
) -> tuple[SpeedPrediction, bool]:
    """``predict_with_attention``'s prediction and ``attention_estimated``: what the window's
    Predicted line shows, and whether it says that attention is estimated."""
    prediction = predict_with_attention(opened, tree, device_map, profile, **options)
    return prediction, attention_estimated(opened, tree, device_map, profile)
