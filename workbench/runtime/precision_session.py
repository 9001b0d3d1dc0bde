"""The session's precision map in use: edits from the tree, the sizes the lanes count under it,
the joint planner as a strategy of the GUI's comparison, and the ``quantization`` section a
wrapped map file carries. No widgets here.

The precision map is ``{module prefix: precision name}`` (longest prefix covers, as in a device
map); modules no key covers keep the model's dtype, and the modules the transformers quantizers
keep in high precision (``default_keep_high_precision``) stay unquantized unless a key names
them exactly.

Example:
    >>> set_module_precision({"model.layers": "int4-g128"}, ["model.layers.0"], "int8")
    {'model.layers': 'int4-g128', 'model.layers.0': 'int8'}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.big_modeling.planning.planner import Placement, PlanResult
from workbench.big_modeling.planning.precision_candidates import pareto_front
from workbench.big_modeling.quantization.keep_high_precision import default_keep_high_precision
from workbench.big_modeling.quantization.precisions import parse_precision
from workbench.big_modeling.quantization.sizes import (
    QuantizableWeights,
    precision_of,
    tensor_nbytes_under,
)
from workbench.models.speed import SpeedPrediction
from workbench.models.tree import ModuleTree
from workbench.runtime.machine_attention import predict_with_attention
from workbench.runtime.planning import device_reserves, planning_dtype
from workbench.runtime.precision_planning import (
    PrecisionPlanning,
    plan_opened_precisions,
)

if TYPE_CHECKING:
    from workbench.models.intake import OpenedModel

__all__ = [
    "JOINT_STRATEGY",
    "MENU_PRECISIONS",
    "JointOutcome",
    "average_bits_of",
    "candidate_outcome",
    "kept_modules",
    "pareto_front",
    "plan_joint",
    "planned_tree",
    "precision_of",
    "precision_section",
    "quantized_tree",
    "resized_tree",
    "set_module_precision",
]

MAX_RESERVE_PASSES = 4
JOINT_STRATEGY = "precision+placement"
"""The comparison's name for the joint planner's row."""

MENU_PRECISIONS: tuple[str, ...] = (
    "int8",
    "int4-g128",
    "int4-g64",
    "int4-g32",
    "nf4",
    "nf4-dq",
    "fp4",
    "fp8",
    "bfloat16",
    "float16",
)
"""The tree's "Set precision" submenu, in menu order (the model dtypes last)."""


def set_module_precision(
    precision_map: Mapping[str, str], names: Iterable[str], precision: str | None
) -> dict[str, str]:
    """A new precision map with ``names`` at ``precision`` (``None``: back to what covers them).

    Keys below a named module are dropped (the new value covers them), so the map stays as
    short as the edit.

    Raises:
        BadInputError: ``precision`` is not a precision name.

    Example:
        >>> set_module_precision({"m.0.mlp": "int8"}, ["m.0"], "int4")
        {'m.0': 'int4-g128'}
    """
    canonical = None if precision is None else parse_precision(precision).name
    targets = [name for name in names]
    result = {
        key: value
        for key, value in precision_map.items()
        if not any(_is_under(key, name) for name in targets)
    }
    if canonical is not None:
        for name in targets:
            result[name] = canonical
    return result


def kept_modules(opened: OpenedModel, precision_map: Mapping[str, str]) -> list[str]:
    """The modules kept in the model's dtype: the transformers defaults less those the map
    names exactly (the user chose a precision for them)."""
    return [name for name in default_keep_high_precision(opened.model) if name not in precision_map]


@dataclass
class _WeightsCache:
    opened: Any = None
    keep: tuple[str, ...] = ()
    weights: QuantizableWeights | None = None


_CACHE = _WeightsCache()


def _weights(opened: OpenedModel, keep: list[str]) -> QuantizableWeights:
    # one entry: the GUI asks for the same model on every refresh; a 70B walk costs ~0.1 s
    if _CACHE.opened is not opened or _CACHE.keep != tuple(keep) or _CACHE.weights is None:
        _CACHE.weights = QuantizableWeights.of(opened.model, keep, planning_dtype(opened))
        _CACHE.opened, _CACHE.keep = opened, tuple(keep)
    return _CACHE.weights


def quantized_tree(opened: OpenedModel, precision_map: Mapping[str, str]) -> ModuleTree:
    """``opened.tree`` with every tensor at its size under ``precision_map`` (what the lanes
    and the speed model count); the tree itself when the map is empty."""
    if not precision_map:
        return opened.tree
    weights = _weights(opened, kept_modules(opened, precision_map))
    sizes = tensor_nbytes_under(precision_map, opened.tree.tensor_nbytes, weights)
    return resized_tree(opened.tree, sizes)


def resized_tree(tree: ModuleTree, tensor_nbytes: Mapping[str, int]) -> ModuleTree:
    """A copy of ``tree`` whose tensors have these bytes and whose module totals follow (a
    map's per-device bytes read the module totals); ``tree`` is left as it is."""
    copies = {
        node.name: dataclasses.replace(node, children=[], parent=None) for node in tree.iter_nodes()
    }
    for node in tree.iter_nodes():
        copy = copies[node.name]
        copy.children = [copies[child.name] for child in node.children]
        for child in copy.children:
            child.parent = copy
    base = tree.tensor_nbytes
    deltas = {  # bytes each module's own tensors gain or lose, then added up the parents
        name: sum(tensor_nbytes.get(t, base[t]) - base[t] for t in node.tensor_names if t in base)
        for name, node in copies.items()
    }
    for name in sorted(copies, key=lambda n: -1 if not n else n.count(".") + 1, reverse=True):
        node = copies[name]
        node.nbytes += deltas[name]
        if node.parent is not None:
            deltas[node.parent.name] += deltas[name]
    return ModuleTree(
        copies,
        leaf_tensors=tree.leaf_tensors,
        tensor_nbytes=dict(tensor_nbytes),
        tensor_owner=tree.tensor_owner,
        tied_groups=tree.tied_groups,
        planning_dtype=tree.planning_dtype,
        tensor_dtypes=tree.tensor_dtypes,
    )


def average_bits_of(opened: OpenedModel, precision_map: Mapping[str, str]) -> float:
    """8 x stored bytes / parameters of the whole model under ``precision_map``."""
    tree = quantized_tree(opened, precision_map)
    params = tree.root.param_count or 1
    return 8.0 * sum(tree.tensor_nbytes.values()) / params


def precision_section(opened: OpenedModel | None, precision_map: Mapping[str, str]) -> dict:
    """The ``quantization`` section of a wrapped map file and a saved session's export."""
    keep = kept_modules(opened, precision_map) if opened is not None else []
    section: dict[str, Any] = {
        "precision_map": dict(precision_map),
        "keep_high_precision": keep,
    }
    if opened is not None:
        section["average_bits"] = round(average_bits_of(opened, precision_map), 3)
    return section


@dataclass(frozen=True)
class JointOutcome:
    """The joint planner's row of the comparison: a ``PlanResult`` shaped as the other
    strategies' (the table and the lanes read it), the speed, and the full joint plan."""

    plan: PlanResult
    prediction: SpeedPrediction
    joint: PrecisionPlanning
    tree: ModuleTree  # the tree at the chosen precisions (the lanes' sizes)


def plan_joint(
    opened: OpenedModel,
    *,
    budgets: Mapping[int | str, int],
    profile: Any,
    precisions: str,
    min_bits: float | None = None,
    reserve: Mapping[int | str, int] | None = None,
    memory: Any = None,
) -> JointOutcome:
    """Plan precision and placement together for the comparison.

    Args:
        reserve: fixed bytes kept free per device.
        memory: the memory model's ``MemoryOptions``: each device then keeps free what the
            plan's own map needs (KV cache and activations of the layers it runs), found by
            re-planning with the previous map's reserves until they stop changing (two or
            three passes: offloaded layers run on the first GPU, so its share settles at once).

    Raises:
        BadInputError: bad precisions, or no plan meets the constraints.
        ValueError: the profile cannot predict a speed for the budgets' devices.
    """
    kept = dict(reserve or {})
    why: dict[Any, str] = {}
    for _ in range(MAX_RESERVE_PASSES):
        joint = plan_opened_precisions(
            opened,
            max_memory=budgets,
            precisions=precisions,
            profile=profile,
            min_bits=min_bits,
            reserve=kept or None,
        )
        if memory is None:
            break
        needed = device_reserves(opened, joint.plan.device_map, memory, joint.plan.precision_map)
        settled = {device: r.nbytes for device, r in needed.items()}
        why = {device: r.why for device, r in needed.items()}
        if settled == kept:
            break
        kept = settled
    chosen = joint.plan.chosen
    reasons = [
        Placement(module="(precision)", device=None, nbytes=0, reason=line)
        for line in joint.plan.trace
    ]
    plan = PlanResult(
        device_map=dict(joint.plan.device_map),
        per_device_bytes=dict(chosen.per_device_bytes),
        trace=reasons,
        reserve=kept,
        reserve_why=why,
    )
    tree = resized_tree(opened.tree, joint.tensor_nbytes)
    return JointOutcome(plan=plan, prediction=joint.prediction, joint=joint, tree=tree)


def candidate_outcome(
    opened: OpenedModel, candidate: Any, profile: Any
) -> tuple[ModuleTree, SpeedPrediction | None]:
    """The sizes and the speed of one ``PrecisionCandidate`` (the Pareto view's preview)."""
    tree = quantized_tree(opened, candidate.precision_map)
    prediction = None
    if candidate.device_map and profile is not None:
        try:
            prediction = predict_with_attention(
                opened, tree, candidate.device_map, profile, precisions=candidate.precision_map
            )
        except ValueError:
            prediction = None
    return tree, prediction


def _is_under(name: str, prefix: str) -> bool:
    return prefix in ("", name) or name.startswith(prefix + ".")


def planned_tree(session: Any) -> ModuleTree | None:
    """The session's tree at its precisions (what the lanes and the speed label count):
    ``session.tree`` itself without a precision map or a model."""
    opened = session.opened
    if opened is None or not session.precision_map:
        return session.tree
    return quantized_tree(opened, session.precision_map)


def planned_nbytes(session: Any) -> dict[str, int]:
    """Each module's bytes at the session's precisions (the tree's Size column), or ``{}``
    when nothing is quantized (the tree's own sizes hold)."""
    if session.opened is None or not session.precision_map:
        return {}
    tree = planned_tree(session)
    return {} if tree is None else {node.name: node.nbytes for node in tree.iter_nodes()}
