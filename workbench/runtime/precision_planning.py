"""Joint precision and placement planning for an opened model: the one path ``workbench plan
--precisions`` (and the GUI's planner, later) take. No widgets here.

``plan_opened_precisions`` feeds the engine's ``plan_precision_and_devices`` with the model's
tree (planning bytes per tensor, parameter count, the speed model's layers) and scores each
candidate with ``workbench.models.speed.predict_speed`` on the candidate's quantized sizes and
precisions, so the speed the CLI prints for the plan is the one the planner maximised, and a
format whose kernel is slow on the device it runs on (``models.kernel_costs``) loses on speed.

The engine's score callback gets a device map and every tensor's bytes, not the candidate's
precisions: ``SizePrecisions`` reads each quantized weight's precision back from its size (the
sizes of each allowed precision are distinct for a weight, except nf4 and fp4, which store the
same bytes: such a tie is scored as the slower kernel). For the detected profile the CPU kernel
probe runs once (cached per machine; ``device_probe.cached_cpu_kernels``) before planning.
``quantization_section`` is the ``quantization`` part of the wrapped JSON document
(``runtime.quantization_code`` writes the ``quantization_config`` of "Copy as code";
``runtime.prequantized_planning`` plans checkpoints stored quantized).

Example:
    >>> result = plan_opened_precisions(open_model("llama-3.1-70b"),
    ...     max_memory=profile.budgets(), precisions="int4,int8,bf16", profile=profile,
    ...     min_bits=4.5)  # doctest: +SKIP
    >>> result.plan.chosen.label  # doctest: +SKIP
    'int4-g128 everywhere'
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.planning.precision_planner import (
    PrecisionPlan,
    compact_layer_names,
    plan_precision_and_devices,
)
from workbench.big_modeling.quantization.keep_high_precision import default_keep_high_precision
from workbench.big_modeling.quantization.precisions import (
    Precision,
    parse_precision,
    parse_precisions,
)
from workbench.big_modeling.quantization.sizes import QuantizableWeights, tensor_nbytes_under
from workbench.models.device_probe import cached_cpu_kernels
from workbench.models.hardware import DETECTED_NAME, HardwareProfile, with_cpu_kernels
from workbench.models.kernel_costs import KernelCosts
from workbench.models.speed import SpeedPrediction, layer_unit_names, predict_speed
from workbench.models.tree import ModuleTree
from workbench.runtime.machine_attention import attention_lookup
from workbench.runtime.planning import planning_dtype

if TYPE_CHECKING:
    from workbench.models.intake import OpenedModel


@dataclass(frozen=True)
class PrecisionPlanning:
    """A joint plan with what the CLI and the GUI show beside it.

    Attributes:
        plan: the engine's ``PrecisionPlan`` (maps, trace, every candidate).
        prediction: the speed model's prediction for the chosen plan (quantized sizes).
        layers: the modules that got one precision each, in model order.
        tensor_nbytes: every tensor's bytes under the chosen precisions.
    """

    plan: PrecisionPlan
    prediction: SpeedPrediction
    layers: tuple[str, ...]
    tensor_nbytes: dict[str, int]


def precision_layers(tree: ModuleTree) -> list[str]:
    """The speed model's no-split layers (decoder blocks), in model order."""
    return [name for name in layer_unit_names(tree) if tree.node(name).no_split]


def parse_keep_at_least(items: Sequence[str], layers: Sequence[str]) -> dict[str, Precision]:
    """``--keep-at-least``: ``LAYERS=PRECISION`` items -> ``{layer or prefix: floor}``.

    ``LAYERS`` is a comma-separated list of module names or prefixes, ``first``, ``last``, or a
    range of layer indices ``3-5`` / ``7``.

    Raises:
        BadInputError: an item without ``=``, an unknown precision, a layer index out of range.

    Example:
        >>> parse_keep_at_least(["first,last=int8"], ["m.0", "m.1", "m.2"])  # doctest: +ELLIPSIS
        {'m.0': Precision(name='int8', ...), 'm.2': Precision(name='int8', ...)}
    """
    floors: dict[str, Precision] = {}
    for item in items:
        names, sep, precision_text = item.rpartition("=")
        if not sep or not names or not precision_text:
            raise BadInputError(
                f"--keep-at-least item {item!r} must look like LAYERS=PRECISION, "
                "e.g. first,last=int8 or model.layers.0=bf16"
            )
        floor = parse_precision(precision_text)
        for name in (part.strip() for part in names.split(",")):
            for layer in _layer_names(name, layers, item):
                current = floors.get(layer)
                if current is None or current.weight_bits < floor.weight_bits:
                    floors[layer] = floor
    return floors


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _layer_names(name: str, layers: Sequence[str], item: str) -> list[str]:
    if name == "first":
        return [layers[0]]
    if name == "last":
        return [layers[-1]]
    match = _RANGE.match(name)
    if match is None:
        return [name]
    first = int(match.group(1))
    last = int(match.group(2) or first)
    if not first <= last < len(layers):
        raise BadInputError(
            f"--keep-at-least item {item!r}: layers {name} are outside 0-{len(layers) - 1}"
        )
    return list(layers[first : last + 1])


def with_tensor_sizes(tree: ModuleTree, tensor_nbytes: Mapping[str, int]) -> ModuleTree:
    """A tree sharing ``tree``'s nodes whose tensors have these bytes (what the speed model
    reads); node totals are not recomputed."""
    return ModuleTree(
        {node.name: node for node in tree.iter_nodes()},
        leaf_tensors=tree.leaf_tensors,
        tensor_nbytes=dict(tensor_nbytes),
        tensor_owner=tree.tensor_owner,
        tied_groups=tree.tied_groups,
        planning_dtype=tree.planning_dtype,
        tensor_dtypes=tree.tensor_dtypes,
    )


class SizePrecisions:
    """Each quantizable weight's precision, read back from its bytes (module docs).

    Example:
        >>> lookup = SizePrecisions(weights, tree.tensor_nbytes, ["int4", "int8"])  # doctest: +SKIP
        >>> lookup.precision_map(sizes)  # doctest: +SKIP
        {'model.layers.0.mlp.up_proj': 'int8', ...}
    """

    def __init__(
        self,
        weights: QuantizableWeights,
        base_nbytes: Mapping[str, int],
        precisions: Sequence[str | Precision],
        kernel_costs: KernelCosts | None = None,
    ) -> None:
        names = [parse_precision(p).name for p in precisions]
        if kernel_costs is not None:  # of two formats with one size, the slower kernel
            names.sort(
                key=lambda n: kernel_costs.efficiency(0, n) + kernel_costs.efficiency("cpu", n)
            )
        self._by_size: dict[str, dict[int, str]] = {}
        for name in reversed(names):
            sizes = tensor_nbytes_under({"": name}, base_nbytes, weights)
            for tensor in weights.shapes:
                if tensor in sizes:
                    self._by_size.setdefault(tensor, {})[sizes[tensor]] = name

    def precision_map(self, tensor_nbytes: Mapping[str, int]) -> dict[str, str]:
        """``{module of a quantizable weight: precision}`` for the sizes given (a weight whose
        size no allowed precision has is left out: it is planned as loaded)."""
        found: dict[str, str] = {}
        for tensor, by_size in self._by_size.items():
            precision = by_size.get(tensor_nbytes.get(tensor, -1))
            if precision is not None:
                found[tensor.rpartition(".")[0]] = precision
        return found


def measured_profile(profile: HardwareProfile) -> HardwareProfile:
    """The detected profile with this CPU's kernel costs measured (once per machine, cached);
    any other profile as it is (what-if hardware uses its own or the documented table)."""
    if profile.name != DETECTED_NAME or profile.kernel_costs.cpu_measured:
        return profile
    probe = cached_cpu_kernels()
    return with_cpu_kernels(profile, probe) if probe is not None else profile


def plan_opened_precisions(
    opened: OpenedModel,
    *,
    max_memory: Mapping[int | str, int],
    precisions: str | Sequence[str | Precision],
    profile: HardwareProfile,
    min_bits: float | None = None,
    keep_at_least: Mapping[str, str | Precision] | None = None,
    keep_high_precision: Sequence[str] | None = None,
    strategy: str = "auto",
    reserve: Mapping[int | str, int] | None = None,
    prefetch: bool = True,
    prompt_tokens: int = 128,
) -> PrecisionPlanning:
    """Plan a precision and a device per layer of ``opened`` for the fastest predicted decode.

    Args:
        max_memory: budgets per device (``profile`` must have every device, for the speed).
        precisions: the allowed precisions, ``"int4,int8,bf16"`` or a sequence.
        profile: the hardware the speed model predicts for.
        min_bits: the least average stored bits per parameter.
        keep_at_least: floors per layer (``parse_keep_at_least``).
        keep_high_precision: modules never quantized; ``None``: the transformers defaults
            (``default_keep_high_precision``).
        strategy, reserve: as for ``plan_opened_model``.
        prefetch, prompt_tokens: as for ``predict_speed``.

    The detected profile's CPU kernels are measured first (``measured_profile``).

    Raises:
        BadInputError: bad precisions or floors, or no plan meeting the constraints.
    """
    allowed = parse_precisions(precisions) if isinstance(precisions, str) else precisions
    tree = opened.tree
    keep = (
        default_keep_high_precision(opened.model)
        if keep_high_precision is None
        else list(keep_high_precision)
    )
    weights = QuantizableWeights.of(opened.model, keep, planning_dtype(opened))
    layers = precision_layers(tree)
    profile = measured_profile(profile)
    floors = list((keep_at_least or {}).values())  # floors may name precisions not allowed
    lookup = SizePrecisions(weights, tree.tensor_nbytes, [*allowed, *floors], profile.kernel_costs)
    # this CPU's timed attention, as the window's Predicted line counts it (the FLOP count
    # predicted nf4 SmolLM2-135M at 23.1 tok/s in the comparison, 20.0 once applied)
    layout, _, attention_times = attention_lookup(opened, profile, tree)

    def score(device_map: Mapping[str, Any], tensor_nbytes: Mapping[str, int]) -> float:
        sized = with_tensor_sizes(tree, tensor_nbytes)
        return predict_speed(
            sized,
            device_map,
            profile,
            prefetch=prefetch,
            prompt_tokens=prompt_tokens,
            precisions=lookup.precision_map(tensor_nbytes),
            attention=layout,
            attention_times=attention_times,
        ).tokens_per_s

    plan = plan_precision_and_devices(
        opened.model,
        max_memory=max_memory,
        precisions=allowed,
        layers=layers,
        base_nbytes=tree.tensor_nbytes,
        weights=weights,
        param_count=tree.root.param_count,
        score=score,
        min_bits=min_bits,
        floors=keep_at_least,
        keep_high_precision=keep,
        strategy=strategy,
        reserve=reserve,
        no_split_module_classes=opened.no_split_modules,
    )
    tensor_nbytes = tensor_nbytes_under(plan.precision_map, tree.tensor_nbytes, weights)
    prediction = predict_speed(
        with_tensor_sizes(tree, tensor_nbytes),
        plan.device_map,
        profile,
        prefetch=prefetch,
        prompt_tokens=prompt_tokens,
        precisions=lookup.precision_map(tensor_nbytes),  # as scored: norms stay plain
        attention=layout,
        attention_times=attention_times,
    )
    return PrecisionPlanning(plan, prediction, tuple(layers), tensor_nbytes)


def quantization_section(result: PrecisionPlanning) -> dict[str, Any]:
    """The ``quantization`` part of ``workbench plan --json``: the precision map, the kept
    modules, the trace and every candidate (for a Pareto view)."""
    plan = result.plan
    return {
        "precision_map": plan.precision_map,
        "keep_high_precision": list(plan.keep_high_precision),
        "average_bits": plan.average_bits,
        "tokens_per_s": plan.tokens_per_s,
        "label": plan.chosen.label,
        "trace": plan.trace,
        "candidates": [
            {
                "label": candidate.label,
                "feasible": candidate.feasible,
                "problem": candidate.problem,
                "tokens_per_s": candidate.tokens_per_s,
                "average_bits": candidate.average_bits,
                "fastest_device_bytes": candidate.fastest_device_bytes(),
                "per_device_bytes": {
                    str(device): nbytes for device, nbytes in candidate.per_device_bytes.items()
                },
                "layer_precisions": list(candidate.layer_precisions),
            }
            for candidate in plan.candidates
        ],
    }


def describe_precisions(result: PrecisionPlanning) -> list[str]:
    """Lines for ``workbench plan``: each run of layers with its precision, then the trace."""
    by_precision: dict[str, list[str]] = {}
    for layer, precision in result.plan.precision_map.items():
        by_precision.setdefault(precision, []).append(layer)
    lines = [
        f"precision  {precision:<10} {compact_layer_names(layers)}"
        for precision, layers in by_precision.items()
    ]
    if result.plan.keep_high_precision:
        lines.append(f"kept       {', '.join(result.plan.keep_high_precision)} (model dtype)")
    return lines + [f"why        {line}" for line in result.plan.trace]
