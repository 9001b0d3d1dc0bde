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
    "attention_lookup",
    "predict_on_screen",
    "predict_with_attention",
]

ATTENTION_ESTIMATED = (
    "attention estimated from its FLOPs: this CPU has not run this model's attention shapes "
    "yet (an inference run times them)"
)
"""Said beside a prediction for this machine whose CPU attention shapes are not timed yet."""


def attention_lookup(
    opened: OpenedModel | None, profile: HardwareProfile, tree: ModuleTree | None
) -> tuple[Any, int, dict[str, Any]]:
    """``opened``'s attention layout (``None`` without a readable config), and when
    ``profile`` is this machine (its matmul curve measured here) the number of distinct
    attention shapes in ``tree``'s dtypes (default ``opened.tree``) and the cached times of
    those this CPU has timed. One read of the cache; nothing is measured."""
    layout = attention_layout_or_none(opened) if opened is not None else None
    if layout is None or profile.cpu_matmul_curve is None:
        return layout, 0, {}
    shapes = attention_shapes_for(tree if tree is not None else opened.tree, layout)
    times = cached_attention_times(shapes, measure_if_missing=False)
    return layout, len({shape.key for shape in shapes}), times


def predict_with_attention(
    opened: OpenedModel | None,
    tree: ModuleTree,
    device_map: Mapping[str, int | str],
    profile: HardwareProfile,
    **options: Any,
) -> SpeedPrediction:
    """``predict_speed(tree, device_map, profile, **options)`` with ``opened``'s attention
    layout and, on this machine, its cached attention times (``predict_on_screen`` without
    the estimated flag)."""
    return predict_on_screen(opened, tree, device_map, profile, **options)[0]


def predict_on_screen(
    opened: OpenedModel | None,
    tree: ModuleTree,
    device_map: Mapping[str, int | str],
    profile: HardwareProfile,
    **options: Any,
) -> tuple[SpeedPrediction, bool]:
    """``predict_with_attention``'s prediction, and whether it counts attention this CPU has
    not timed: the profile is this machine's, ``device_map`` runs on the CPU, and some of the
    model's attention shapes have no cached times (``attention_probe``: an inference run
    measures them; until then the speed model counts their FLOPs and bytes, which predicted a
    60M float16 Llama at 114 tok/s where it was 81.5 with its attention timed). What the
    window's Predicted line and the fit table's cells show, and whether they say
    ``ATTENTION_ESTIMATED``."""
    layout, shapes, times = attention_lookup(opened, profile, tree)
    prediction = predict_speed(
        tree, device_map, profile, **options, attention=layout, attention_times=times
    )
    return prediction, main_device(device_map) == "cpu" and len(times) < shapes
