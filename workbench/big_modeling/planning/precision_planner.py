"""Plan precision and placement together: ``plan_precision_and_devices``.

Which precision each layer gets decides what fits on the fast device, and what fits decides
the speed; the joint planner searches both. A *candidate* gives every layer (the no-split
blocks, e.g. decoder layers) one precision from the allowed list; the reference planner
(``plan_device_map``, the one ``infer_auto_device_map`` runs) then places the model with the
candidate's exact quantized sizes (``quantization.sizes``), and a speed function supplied by the
caller (the runtime passes ``workbench.models.speed.predict_speed``: bytes moved per token over
each link, compute per device) scores the placement. The engine itself never models hardware.

Candidates searched, with ``P`` the allowed precisions from fewest to most bytes:

1. each precision for every layer;
2. for each pair ``lo < hi`` of ``P``: ``k`` layers at ``hi``, the others at ``lo``, the ``k``
   most sensitive layers first (the first and last layers, then inwards, as llama.cpp's
   ``use_more_bits`` favours the ends of the stack): the smallest ``k`` meeting ``min_bits``,
   a few evenly spaced ``k`` for the Pareto view, and (for neighbouring precisions, by
   galloping bisection) the largest ``k`` whose speed stays within ``tie_tolerance`` of the
   best: more bits for free.

Layers named in ``floors`` never go below their floor. A candidate is *feasible* when it fits
the budgets and its average bits (8 x stored bytes / parameters, whole model) reach
``min_bits``. The plan is the fastest feasible candidate; candidates within ``tie_tolerance``
(2 %) of its speed count as ties and the one with the most bits wins. Every candidate is kept,
for a Pareto view (bytes on the fastest device vs speed, coloured by bits).

Example:
    >>> plan = plan_precision_and_devices(model, max_memory={0: "24GiB", "cpu": "64GiB"},
    ...     precisions=["int4", "int8", "bf16"], layers=layers, base_nbytes=tree.tensor_nbytes,
    ...     weights=QuantizableWeights.of(model), param_count=n, score=speed)  # doctest: +SKIP
    >>> plan.precision_map  # doctest: +SKIP
    {'model.layers.0': 'int8', 'model.layers.1': 'int4-g128', ..., 'model.layers.79': 'int8'}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from torch import nn

from workbench.big_modeling.devices import Device, DeviceValue
from workbench.big_modeling.errors import BadInputError, MemoryBudgetError
from workbench.big_modeling.planning.module_index import ModuleIndex
from workbench.big_modeling.planning.planner import plan_device_map
from workbench.big_modeling.planning.precision_candidates import (
    PrecisionCandidate,
    PrecisionPlan,
    pareto_front,
    precision_rank,
)
from workbench.big_modeling.planning.precision_trace import compact_layer_names, explain_choice
from workbench.big_modeling.quantization.precisions import Precision, parse_precision
from workbench.big_modeling.quantization.sizes import QuantizableWeights, tensor_nbytes_under

__all__ = [
    "PrecisionCandidate",
    "PrecisionPlan",
    "compact_layer_names",
    "explain_choice",
    "pareto_front",
    "plan_precision_and_devices",
    "precision_rank",
    "sensitivity_order",
]

SpeedFunction = Callable[[Mapping[str, Device], Mapping[str, int]], float]
"""``score(device_map, tensor_nbytes) -> decode tokens per second``."""

PARETO_STEPS = 3
"""Evenly spaced mixes per precision pair kept for the Pareto view, besides the searched ones."""


def sensitivity_order(layer_count: int) -> list[int]:
    """Layer indices from most to least sensitive: the ends of the stack first, then inwards.

    Example:
        >>> sensitivity_order(5)
        [0, 4, 1, 3, 2]
    """
    order: list[int] = []
    low, high = 0, layer_count - 1
    while low <= high:
        order.append(low)
        if high != low:
            order.append(high)
        low, high = low + 1, high - 1
    return order


def plan_precision_and_devices(
    model: nn.Module,
    *,
    max_memory: Mapping[DeviceValue, int | str],
    precisions: Iterable[str | Precision],
    layers: Sequence[str],
    base_nbytes: Mapping[str, int],
    weights: QuantizableWeights,
    param_count: int,
    score: SpeedFunction,
    min_bits: float | None = None,
    floors: Mapping[str, str | Precision] | None = None,
    keep_high_precision: Iterable[str] = (),
    strategy: str = "auto",
    reserve: Mapping[DeviceValue, int | str] | None = None,
    no_split_module_classes: Iterable[str] | None = None,
    tie_tolerance: float = 0.02,
) -> PrecisionPlan:
    """Choose a precision and a device per layer for the highest predicted decode speed.

    Args:
        model: the (meta) model; the reference planner places it.
        max_memory: budgets per device, as for ``plan_device_map``.
        precisions: the allowed precisions (names or ``Precision``).
        layers: the modules that get one precision each, in model order (decoder layers).
        base_nbytes: planning bytes per tensor before quantization (the module tree's).
        weights: the quantizable Linear weights (``QuantizableWeights.of(model, keep)``).
        param_count: parameters of the whole model (for average bits).
        score: decode tokens/s of a device map given every tensor's bytes.
        min_bits: the least average bits per parameter a plan may have.
        floors: ``{module prefix: precision}`` a layer at or under the prefix must reach.
        keep_high_precision: modules left unquantized (reported in the plan only; ``weights``
            already excludes them).
        strategy, reserve, no_split_module_classes: as for ``plan_device_map``.
        tie_tolerance: speeds within this fraction of the best count as ties.

    Returns:
        A ``PrecisionPlan`` with the winning maps, the trace and every candidate.

    Raises:
        BadInputError: no precision, no layer, an unknown precision, a floor naming no layer,
            or no candidate meeting ``min_bits`` within the budgets (naming the best found).
    """
    allowed = sorted({parse_precision(p) for p in precisions}, key=precision_rank)
    if not allowed:
        raise BadInputError("no precision allowed; give at least one, e.g. int4,int8,bf16")
    if not layers:
        raise BadInputError("no layers to assign precisions to; the model has no no-split blocks")
    search = _Search(
        model=model,
        max_memory=max_memory,
        layers=list(layers),
        base_nbytes=base_nbytes,
        weights=weights,
        param_count=max(int(param_count), 1),
        score=score,
        min_bits=min_bits,
        floor_ranks=_layer_floors(layers, floors or {}),
        strategy=strategy,
        reserve=reserve,
        no_split=list(no_split_module_classes or []),
    )
    for precision in allowed:
        search.evaluate(search.assign(0, precision.name, precision.name))
    pairs = [(lo.name, hi.name) for i, lo in enumerate(allowed) for hi in allowed[i + 1 :]]
    lowest_k = {pair: search.lowest_k(*pair) for pair in pairs}
    for pair, k in lowest_k.items():
        if k is not None:
            search.evaluate(search.assign(k, *pair))
    for pair, k in lowest_k.items():
        if k is None:
            continue
        span = len(layers) - k
        for step in range(1, PARETO_STEPS):
            search.evaluate(search.assign(k + span * step // PARETO_STEPS, *pair))
    best_speed = max((c.tokens_per_s for c in search.candidates if c.feasible), default=0.0)
    adjacent = set(zip([p.name for p in allowed], [p.name for p in allowed[1:]], strict=False))
    for pair, k in lowest_k.items():
        if k is not None and best_speed > 0 and pair in adjacent:
            search.bisect_largest_k(k, pair, (1 - tie_tolerance) * best_speed)
    chosen = _choose(search.candidates, tie_tolerance)
    return PrecisionPlan(
        device_map=chosen.device_map,
        precision_map=chosen.precision_map,
        keep_high_precision=tuple(sorted(keep_high_precision)),
        chosen=chosen,
        candidates=list(search.candidates),
        trace=explain_choice(chosen, search.candidates, layers, tie_tolerance),
    )


def _layer_floors(
    layers: Sequence[str], floors: Mapping[str, str | Precision]
) -> list[Precision | None]:
    result: list[Precision | None] = [None] * len(layers)
    unmatched: list[str] = []
    for prefix, value in floors.items():
        floor = parse_precision(value)
        hits = [
            i
            for i, layer in enumerate(layers)
            if not prefix
            or layer == prefix
            or layer.startswith(prefix + ".")
            or prefix.startswith(layer + ".")
        ]
        if not hits:
            unmatched.append(prefix)
        for i in hits:
            current = result[i]
            if current is None or precision_rank(floor) > precision_rank(current):
                result[i] = floor
    if unmatched:
        raise BadInputError(
            f"precision floors name no planned layer: {', '.join(sorted(unmatched))}; "
            f"use layer names such as {layers[0]!r} or a prefix of them"
        )
    return result


@dataclass
class _Search:
    model: nn.Module
    max_memory: Mapping[DeviceValue, int | str]
    layers: list[str]
    base_nbytes: Mapping[str, int]
    weights: QuantizableWeights
    param_count: int
    score: SpeedFunction
    min_bits: float | None
    floor_ranks: list[Precision | None]
    strategy: str
    reserve: Mapping[DeviceValue, int | str] | None
    no_split: list[str]
    candidates: list[PrecisionCandidate] = field(default_factory=list)
    _seen: dict[tuple[str, ...], PrecisionCandidate] = field(default_factory=dict)
    _layer_bytes: dict[str | None, list[int]] = field(default_factory=dict)
    _tensor_bytes: dict[str, dict[str, int]] = field(default_factory=dict)
    _ancestors: dict[str, list[str]] = field(default_factory=dict)
    #: walk the model once and re-size a copy of its index per candidate (False: the planner
    #: walks it per candidate, from ``module_sizes``; same plans, kept to check that)
    REUSE_INDEX: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self._module_names = [name for name, _ in self.model.named_modules()]
        self._layer_index = {name: i for i, name in enumerate(self.layers)}
        self._order = sensitivity_order(len(self.layers))
        self._owner = self._tensor_layers()
        self._index: ModuleIndex | None = None
        self._base_sizes: list[int] = []
        self._tensor_positions: dict[str, list[int]] = {}

    def _indexed(self) -> ModuleIndex:
        """The model's index, built once, with each module's position-wise base size (what
        ``module_sizes(base_nbytes)`` gives it) and each tensor's ancestor positions."""
        if self._index is None:
            index = ModuleIndex.build(self.model)
            _ = index.class_names, index.leaf_positions()  # made once, shared by the copies
            position = {index.name_of(p): p for p in range(len(index.modules))}
            names = self.module_sizes(self.base_nbytes)  # fills _ancestors
            self._base_sizes = [  # a module missing from the names keeps its walked size
                int(names.get(index.name_of(p), index.sizes[p])) for p in range(len(index.sizes))
            ]
            self._tensor_positions = {
                tensor: [position[name] for name in chain if name in position]
                for tensor, chain in self._ancestors.items()
            }
            self._index = index
        return self._index

    def placement_index(self, tensor_nbytes: Mapping[str, int]) -> ModuleIndex:
        """The model's index with every module sized from ``tensor_nbytes`` (``module_sizes``
        of it, position by position): the base sizes plus each changed tensor's difference."""
        index = self._indexed()
        sizes = list(self._base_sizes)
        base, positions = self.base_nbytes, self._tensor_positions
        for tensor in self._owner:
            delta = tensor_nbytes.get(tensor, 0) - base.get(tensor, 0)
            if delta:
                for position in positions.get(tensor, ()):
                    sizes[position] += delta
        return index.resized(sizes)

    def _tensor_layers(self) -> dict[str, int]:
        """Which planned layer each quantizable weight belongs to."""
        owner: dict[str, int] = {}
        for tensor in self.weights.shapes:
            name = tensor
            while name:
                name = name.rpartition(".")[0]
                if name in self._layer_index:
                    owner[tensor] = self._layer_index[name]
                    break
        return owner

    def assign(self, k: int, low: str, high: str) -> tuple[str, ...]:
        """``k`` most sensitive layers at ``high``, the others at ``low``, floors applied."""
        chosen = [low] * len(self.layers)
        for index in self._order[:k]:
            chosen[index] = high
        for index, floor in enumerate(self.floor_ranks):
            if floor is not None and precision_rank(chosen[index]) < precision_rank(floor):
                chosen[index] = floor.name
        return tuple(chosen)

    def tensor_nbytes(self, assignment: tuple[str, ...]) -> dict[str, int]:
        """Every tensor's bytes with layer ``i`` at ``assignment[i]`` (what
        ``tensor_nbytes_under`` gives for the candidate's map, from cached per-precision sizes)."""
        sizes = dict(self.base_nbytes)
        for precision in set(assignment):
            self.bytes_per_layer(precision)
        for tensor, index in self._owner.items():
            if tensor in sizes:
                sizes[tensor] = self._tensor_bytes[assignment[index]][tensor]
        return sizes

    def module_sizes(self, tensor_nbytes: Mapping[str, int]) -> dict[str, int]:
        """``module_sizes_of`` with each tensor's module ancestors resolved once per search."""
        if not self._ancestors:
            known = set(self._module_names)
            for tensor in tensor_nbytes:
                chain, name = [], tensor
                while name:
                    name = name.rpartition(".")[0]
                    if name in known:
                        chain.append(name)
                self._ancestors[tensor] = chain
        sizes = dict.fromkeys(self._module_names, 0)
        for tensor, nbytes in tensor_nbytes.items():
            for name in self._ancestors.get(tensor, ()):
                sizes[name] += nbytes
        return sizes

    def bytes_per_layer(self, precision: str | None) -> list[int]:
        """Stored bytes of each layer's quantizable weights at ``precision`` (``None``: as
        planned, unquantized), cached."""
        if precision not in self._layer_bytes:
            covering = {} if precision is None else {"": precision}
            sizes = tensor_nbytes_under(covering, self.base_nbytes, self.weights)
            if precision is not None:
                self._tensor_bytes[precision] = sizes
            totals = [0] * len(self.layers)
            for tensor, index in self._owner.items():
                totals[index] += sizes.get(tensor, 0)
            self._layer_bytes[precision] = totals
        return self._layer_bytes[precision]

    def average_bits(self, assignment: tuple[str, ...]) -> float:
        """8 x stored bytes / parameters, from cached per-layer sums (no placement)."""
        base = sum(self.base_nbytes.values()) - sum(self.bytes_per_layer(None))
        quantized = sum(
            self.bytes_per_layer(precision)[i] for i, precision in enumerate(assignment)
        )
        return 8 * (base + quantized) / self.param_count

    def lowest_k(self, low: str, high: str) -> int | None:
        """The fewest ``high`` layers for which ``min_bits`` holds, ``None`` if none does."""
        if self.min_bits is None:
            return 0
        for k in range(len(self.layers) + 1):
            if self.average_bits(self.assign(k, low, high)) >= self.min_bits - 1e-9:
                return k
        return None

    def evaluate(self, assignment: tuple[str, ...]) -> PrecisionCandidate:
        if assignment in self._seen:
            return self._seen[assignment]
        precision_map = _precision_map(self.layers, assignment)
        tensor_nbytes = self.tensor_nbytes(assignment)
        average_bits = 8 * sum(tensor_nbytes.values()) / self.param_count
        label = _label(assignment)
        sizing: dict[str, object] = (
            {"module_index": self.placement_index(tensor_nbytes)}
            if self.REUSE_INDEX
            else {"module_sizes": self.module_sizes(tensor_nbytes)}
        )
        try:
            plan = plan_device_map(
                self.model,
                max_memory=self.max_memory,
                strategy=self.strategy,  # type: ignore[arg-type]
                no_split_module_classes=self.no_split,
                reserve=self.reserve,
                **sizing,  # type: ignore[arg-type]
            )
        except MemoryBudgetError as exc:
            candidate = PrecisionCandidate(
                label, assignment, precision_map, {}, {}, 0.0, average_bits, str(exc)
            )
        else:
            problem = ""
            if self.min_bits is not None and average_bits < self.min_bits - 1e-9:
                problem = f"average {average_bits:.2f} bits is under the minimum {self.min_bits:g}"
            candidate = PrecisionCandidate(
                label,
                assignment,
                precision_map,
                plan.device_map,
                dict(plan.per_device_bytes),
                float(self.score(plan.device_map, tensor_nbytes)),
                average_bits,
                problem,
            )
        self._seen[assignment] = candidate
        self.candidates.append(candidate)
        return candidate

    def bisect_largest_k(self, k_low: int, pair: tuple[str, str], speed_floor: float) -> None:
        """Evaluate the largest ``k`` (more ``high`` layers) whose speed is still at least
        ``speed_floor``, assuming speed falls as bytes grow: gallop from ``k_low`` (1, 2, 4 ...
        more layers), then bisect, so a full fast device costs one or two placements."""
        if self.evaluate(self.assign(k_low, *pair)).tokens_per_s < speed_floor:
            return
        if self.evaluate(self.assign(len(self.layers), *pair)).tokens_per_s >= speed_floor:
            return
        low, step = k_low, 1
        high = len(self.layers)
        while low + step < high:
            if self.evaluate(self.assign(low + step, *pair)).tokens_per_s < speed_floor:
                high = low + step
                break
            low, step = low + step, step * 2
        while high - low > 1:
            middle = (low + high) // 2
            if self.evaluate(self.assign(middle, *pair)).tokens_per_s >= speed_floor:
                low = middle
            else:
                high = middle


def _precision_map(layers: Sequence[str], assignment: tuple[str, ...]) -> dict[str, str]:
    """One entry per planned layer: weights outside the layers (none in a decoder stack but the
    kept ``lm_head``) stay in the model's dtype, in the planner's sizes and in the loader."""
    return dict(zip(layers, assignment, strict=True))


def _label(assignment: tuple[str, ...]) -> str:
    counts: dict[str, int] = {}
    for precision in assignment:
        counts[precision] = counts.get(precision, 0) + 1
    if len(counts) == 1:
        return f"{assignment[0]} everywhere"
    ordered = sorted(counts, key=precision_rank, reverse=True)
    return ", ".join(f"{p} on {counts[p]} layer{'s' * (counts[p] != 1)}" for p in ordered)


def _choose(candidates: Sequence[PrecisionCandidate], tie_tolerance: float) -> PrecisionCandidate:
    feasible = [c for c in candidates if c.feasible]
    if not feasible:
        best = max(candidates, key=lambda c: (c.tokens_per_s > 0, c.average_bits))
        raise BadInputError(
            f"no precision plan fits the budgets and the bits constraint; closest: {best.label} "
            f"({best.problem}). Allow a smaller precision, lower the minimum bits or add memory"
        )
    fastest = max(c.tokens_per_s for c in feasible)
    tied = [c for c in feasible if c.tokens_per_s >= (1 - tie_tolerance) * fastest]
    return max(tied, key=lambda c: (c.average_bits, c.tokens_per_s))
