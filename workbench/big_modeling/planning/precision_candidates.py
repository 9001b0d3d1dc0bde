"""The joint planner's values: one ``PrecisionCandidate`` per precision assignment placed and
scored, the chosen ``PrecisionPlan``, the fidelity order of precisions and the Pareto front.

Example:
    >>> precision_rank("int8") > precision_rank("int4-g32") > precision_rank("int4-g128")
    True
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from workbench.big_modeling.devices import Device, device_sort_key
from workbench.big_modeling.quantization.precisions import Precision, parse_precision
from workbench.big_modeling.quantization.sizes import bits_per_weight


@dataclass(frozen=True)
class PrecisionCandidate:
    """One precision assignment the planner placed and scored.

    Attributes:
        label: in words: ``"int4-g128 everywhere"``, ``"int8 on 12 layers, int4-g128 on 114"``.
        layer_precisions: one precision name per planned layer, in model order.
        precision_map: ``{layer: precision}`` for every planned layer.
        device_map: the reference planner's map for these sizes (``{}`` when it did not fit).
        per_device_bytes: bytes placed per device.
        tokens_per_s: predicted decode speed (0.0 when it did not fit).
        average_bits: 8 x stored bytes / parameters over the whole model.
        problem: why it is not feasible (``""`` when it is).
    """

    label: str
    layer_precisions: tuple[str, ...]
    precision_map: dict[str, str]
    device_map: dict[str, Device]
    per_device_bytes: dict[Device, int]
    tokens_per_s: float
    average_bits: float
    problem: str = ""

    @property
    def feasible(self) -> bool:
        """Whether it fits the budgets and meets the bits constraint."""
        return not self.problem

    def fastest_device_bytes(self) -> int:
        """Bytes on the first device the planner fills (the Pareto view's x axis)."""
        if not self.per_device_bytes:
            return 0
        return self.per_device_bytes[min(self.per_device_bytes, key=device_sort_key)]


@dataclass(frozen=True)
class PrecisionPlan:
    """The joint plan: a device and a precision per module, the reasons, every candidate.

    Attributes:
        device_map: the plain transformers ``device_map``.
        precision_map: ``{layer: precision}`` (longest prefix covers; modules no key covers
            keep the model's dtype).
        keep_high_precision: modules whose Linear weights keep the model's dtype.
        chosen: the winning candidate.
        candidates: every candidate considered, in search order.
        trace: the choice explained in words, one line per alternative.
    """

    device_map: dict[str, Device]
    precision_map: dict[str, str]
    keep_high_precision: tuple[str, ...]
    chosen: PrecisionCandidate
    candidates: list[PrecisionCandidate] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.chosen.tokens_per_s

    @property
    def average_bits(self) -> float:
        return self.chosen.average_bits

    @property
    def per_device_bytes(self) -> dict[Device, int]:
        return self.chosen.per_device_bytes


def pareto_front(candidates: Iterable[PrecisionCandidate]) -> list[PrecisionCandidate]:
    """The feasible candidates no other beats on all three of: less memory on the fastest
    device, more tokens/s, more average bits; sorted by memory (the Pareto view's highlight).

    Example:
        >>> [c.label for c in pareto_front(plan.candidates)]  # doctest: +SKIP
        ['int4-g128 everywhere', 'int8 on 2 layers, int4-g128 on 78 layers']
    """
    feasible = [c for c in candidates if c.feasible]

    def key(c: PrecisionCandidate) -> tuple[int, float, float]:
        return (-c.fastest_device_bytes(), c.tokens_per_s, c.average_bits)

    front = [
        c
        for c in feasible
        if not any(
            all(x >= y for x, y in zip(key(o), key(c), strict=True)) and key(o) != key(c)
            for o in feasible
        )
    ]
    return sorted(front, key=lambda c: c.fastest_device_bytes())


def precision_rank(precision: str | Precision) -> tuple[int, float]:
    """Order of fidelity: weight bits, then stored bits (int4-g32 above int4-g128)."""
    p = parse_precision(precision)
    return (p.weight_bits, bits_per_weight(p))
