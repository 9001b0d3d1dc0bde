"""Device-map planning: ``infer_auto_device_map``, ``get_balanced_memory`` and ``plan_device_map``.

The planner is a pure function of module sizes and budgets: it never queries CUDA, so budgets
for hardware you do not have plan just as well (what-if planning)::

    plan = plan_device_map(model, max_memory={0: "24GiB", 1: "24GiB", "cpu": "64GiB"})

Only ``max_memory=None`` looks at real hardware, through ``get_max_memory``.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from workbench.big_modeling.device_map.value import clean_device_map
from workbench.big_modeling.devices import Device, DeviceValue, device_label, normalize_device
from workbench.big_modeling.errors import BadInputError, MemoryBudgetError
from workbench.big_modeling.planning.charges import apply_charges, charge_within, charged_by_device
from workbench.big_modeling.planning.module_index import ModuleIndex
from workbench.big_modeling.planning.on_demand_index import build_planner_index
from workbench.big_modeling.planning.placement import run_placement
from workbench.big_modeling.planning.sizes import (
    convert_file_size_to_int,
    format_nbytes,
    get_max_memory,
)

__all__ = [
    "Placement",
    "PlanResult",
    "get_balanced_memory",
    "infer_auto_device_map",
    "plan_device_map",
]

logger = logging.getLogger(__name__)

ReserveForMap = Callable[[Mapping[str, Device]], Mapping[Device, int]]
"""A device map -> the bytes each device must keep free to run it (KV cache, activations)."""

MAX_RESERVE_ROUNDS = 16

Strategy = Literal["auto", "balanced", "balanced_low_0", "sequential"]
STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


@dataclass(frozen=True)
class Placement:
    """One planner decision: ``module`` went to ``device`` because of ``reason``.

    ``device`` is ``None`` for a module that was split into its parts (each part has its own
    placement); ``nbytes`` is the module's size under the planning dtype.
    """

    module: str
    device: Device | None
    nbytes: int
    reason: str


@dataclass(frozen=True)
class PlanResult:
    """A device map with its per-device totals and the reasons behind it.

    ``reserve`` is the bytes kept free per device (the fixed ``reserve`` plus, with
    ``reserve_for_map``, what the final map needs); ``reserve_why`` says why in words, per
    device, when the caller's memory model gives reasons (``workbench.runtime.planning``).
    """

    device_map: dict[str, Device]
    per_device_bytes: dict[Device, int]
    trace: list[Placement]
    reserve: dict[Device, int] = field(default_factory=dict)
    reserve_why: dict[Device, str] = field(default_factory=dict)


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[DeviceValue, int | str] | None = None,
    no_split_module_classes: Iterable[str] | str | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
    *,
    reserve: Mapping[DeviceValue, int | str] | None = None,
    module_sizes: Mapping[str, int] | None = None,
) -> dict[str, Device]:
    """Compute a device map: GPUs first, then CPU, then disk.

    Guarantees: no device holds more than its budget; when something is offloaded to CPU, GPU 0
    keeps room to bring back the largest CPU-offloaded layer (and the CPU keeps room for the
    largest disk-offloaded one); classes in ``no_split_module_classes`` are never split; tied
    parameters share a device; the direct buffers of a split module stay in the map. Works from
    shapes and dtypes only, so the model may be on ``meta``, and the devices need not exist.

    Args:
        model: the model to place.
        max_memory: bytes or size strings per device, e.g. ``{0: "1GiB", "cpu": "30GB"}``;
            default: what is free now (``get_max_memory``). ``"disk"`` is unlimited unless given.
        no_split_module_classes: class names never split across devices (e.g. decoder blocks).
        dtype: dtype floating weights will be loaded in.
        special_dtypes: per-tensor dtypes overriding ``dtype``.
        verbose: log (``logging.INFO``) why each module went where.
        clean_result: merge submodules placed on one device into their parent's key.
        offload_buffers: buffers of offloaded modules are offloaded too; if ``False`` (default)
            they stay on the execution device, and a ``UserWarning`` says when they fit no GPU
            (counting what each GPU holds and the room it keeps for offloaded layers, as the
            reference does). A device left empty for lack of memory is logged (INFO,
            "insufficient memory", with the bytes it would need).
        fallback_allocation: when the next module does not fit an empty device, place the first
            module (depth first) that does.
        reserve: extra keyword: bytes per device kept free for activations and KV cache
            (see ``estimate_activation_reserve``).
        module_sizes: extra keyword: precomputed ``{name: nbytes}`` overriding computed sizes.

    Returns:
        ``{module name: device}`` with devices as ints (GPUs), ``"cpu"``, ``"disk"``, ``"mps"``.

    Raises:
        MemoryBudgetError: for bad budgets, or when a limited ``"disk"`` budget is full.

    Example:
        >>> model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(3)])  # 80 B each
        >>> # GPU 0 keeps 80 B for the largest offloaded layer: 180 - 80 = 100 B, one layer
        >>> infer_auto_device_map(model, max_memory={0: 180, "cpu": 1000})
        {'0': 0, '1': 'cpu', '2': 'cpu'}
    """
    plan, _ = _plan(
        model,
        max_memory=max_memory,
        strategy="sequential",
        no_split_module_classes=no_split_module_classes,
        dtype=dtype,
        special_dtypes=special_dtypes,
        reserve=reserve,
        offload_buffers=offload_buffers,
        fallback_allocation=fallback_allocation,
        clean_result=clean_result,
        explain=verbose,
        module_sizes=module_sizes,
    )
    if verbose:
        for placement in plan.trace:
            logger.info("%s", placement.reason)
    return plan.device_map


def plan_device_map(
    model: nn.Module,
    *,
    max_memory: Mapping[DeviceValue, int | str] | None,
    strategy: Strategy = "auto",
    no_split_module_classes: Iterable[str] | str | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    reserve: Mapping[DeviceValue, int | str] | None = None,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
    module_sizes: Mapping[str, int] | None = None,
    reserve_for_map: ReserveForMap | None = None,
    charges: Mapping[str, int] | None = None,
    module_index: ModuleIndex | None = None,
) -> PlanResult:
    """Plan a device map and say why: totals per device and one reason per decision.

    ``strategy`` is what ``device_map=`` accepts in ``load_checkpoint_and_dispatch``: ``"auto"``
    and ``"balanced"`` spread layers evenly over the GPUs (``get_balanced_memory``),
    ``"balanced_low_0"`` keeps GPU 0 as empty as it can (for generation), ``"sequential"``
    fills GPU 0, then GPU 1, ... Other arguments as in ``infer_auto_device_map``.

    ``reserve_for_map`` (a device map -> bytes per device, e.g. the KV cache of the layers each
    device runs plus their activation peak) makes the reserve depend on the map, and
    ``charges`` (module name -> bytes, e.g. each decoder layer's KV cache) is the part of it
    that travels with a module: it is added to the module's size, so the greedy pass places a
    layer's cache with the layer and a GPU takes as many layers as fit *with* their caches.
    What remains (the activation peak; the caches of CPU/disk-offloaded layers, which live on
    the GPU that runs them, a device the pass has already left) depends on the map, and the
    map on it, so the plan is a fixed point, found by raising reserves only::

        extra_0 = {}
        map_k   = plan(budgets - reserve - extra_k, sizes + charges)
        rest_k  = reserve_for_map(map_k) - the charges the pass put on each device
        stop when rest_k[d] <= extra_k[d] on every device d, else
        extra_k+1[d] = max(extra_k[d], rest_k[d])

    The result is exact in this sense: every device holds its weights plus what
    ``reserve_for_map`` says *the returned map* needs there, within its budget (checked, not
    assumed). ``per_device_bytes`` stay weights (charges taken out) and ``reserve`` is
    ``reserve`` plus ``reserve_for_map(device_map)``. Reserves only grow, so the loop ends;
    it is cut at ``MAX_RESERVE_ROUNDS`` rounds with a ``MemoryBudgetError``. The offloaded
    layers' caches grow with the reserve on the main GPU (fewer layers stay there), so raising
    is the right direction; a device that ran layers in an earlier round keeps its
    activation reserve. Charges of modules on the CPU or disk count against those devices
    too (conservative: their caches live on the GPU). Reserves for devices without a budget
    (an unlimited disk) are dropped.

    ``module_index`` (``ModuleIndex.build(model)``, sizes as given, e.g. ``resized``) skips the
    walk over ``model`` for a caller that plans the same model many times; ``module_sizes``
    and ``charges`` apply to a copy of it.

    Returns:
        ``PlanResult(device_map, per_device_bytes, trace)``; ``trace`` holds a ``Placement``
        per decision, reasons in words such as "layers.38 does not fit on cuda:0: 1.6 GiB
        needed, 0.9 GiB left after the 2.0 GiB reserve; layers.38 fits on cpu: ...".

    Raises:
        BadInputError: for an unknown strategy; MemoryBudgetError as in ``infer_auto_device_map``.

    Example:
        >>> model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)])  # 80 B each
        >>> plan_device_map(model, max_memory={0: 1000, 1: 1000}, strategy="balanced").device_map
        {'0': 0, '1': 0, '2': 1, '3': 1}
        >>> # 40 B of cache per layer on GPU 0. Round 1: 250 - 80 (kept for an offloaded
        >>> # layer) = 170 B holds 2 layers, which need 80 B; round 2: 250 - 80 - 80 = 90 B
        >>> # holds 1 layer, which needs 40 B <= 80 B: done (2 layers would need 320 B)
        >>> def cache(device_map):
        ...     return {0: 40 * sum(1 for d in device_map.values() if d == 0)}
        >>> plan = plan_device_map(model, max_memory={0: 250, "cpu": 1000},
        ...                        strategy="sequential", reserve_for_map=cache)
        >>> plan.device_map, plan.reserve
        ({'0': 0, '1': 'cpu', '2': 'cpu', '3': 'cpu'}, {0: 40})
    """

    def plan_with(extra: Mapping[Device, int]) -> tuple[PlanResult, dict[Device, int]]:
        fixed = _reserve_bytes(reserve)
        total = {d: fixed.get(d, 0) + extra.get(d, 0) for d in {*fixed, *extra}}
        result, counted = _plan(
            model,
            max_memory=max_memory,
            strategy=strategy,
            no_split_module_classes=no_split_module_classes,
            dtype=dtype,
            special_dtypes=special_dtypes,
            reserve={d: n for d, n in total.items() if n} or None,
            offload_buffers=offload_buffers,
            fallback_allocation=fallback_allocation,
            clean_result=True,
            explain=True,
            module_sizes=module_sizes,
            charges=charges,
            module_index=module_index,
        )
        kept = {d: n for d, n in total.items() if n}
        plan = PlanResult(result.device_map, result.per_device_bytes, result.trace, kept)
        return plan, counted

    if reserve_for_map is None:
        return plan_with({})[0]
    budgeted = set(get_max_memory(max_memory))
    extra: dict[Device, int] = {}
    for _ in range(MAX_RESERVE_ROUNDS):
        with warnings.catch_warnings(record=True) as caught:  # only the final round's count
            warnings.simplefilter("always")
            plan, counted = plan_with(extra)
        need = {
            normalize_device(d): int(n)
            for d, n in reserve_for_map(plan.device_map).items()
            if normalize_device(d) in budgeted
        }
        rest = {d: n - counted.get(d, 0) for d, n in need.items()}
        if all(n <= extra.get(d, 0) for d, n in rest.items()):
            for warning in caught:
                warnings.warn(warning.message, warning.category, stacklevel=2)
            fixed = _reserve_bytes(reserve)
            kept = {d: fixed.get(d, 0) + need.get(d, 0) for d in {*fixed, *need}}
            _check_reserves_fit(plan, kept, get_max_memory(max_memory))
            return dataclasses.replace(plan, reserve={d: n for d, n in kept.items() if n})
        extra = {d: max(extra.get(d, 0), rest.get(d, 0)) for d in {*extra, *rest}}
    raise MemoryBudgetError(
        f"no map holds its own reserve after {MAX_RESERVE_ROUNDS} rounds (last reserve: "
        + ", ".join(f"{device_label(d)}={format_nbytes(n)}" for d, n in extra.items())
        + "); give the devices more memory or plan for a shorter context"
    )


def _check_reserves_fit(
    plan: PlanResult, reserves: Mapping[Device, int], budgets: Mapping[Device, int]
) -> None:
    """Refuse a converged plan whose reserve does not fit beside the weights on some device.

    The fixed point can settle on a device that holds no weights but must run the offloaded
    layers (the CPU for an all-disk map) with a reserve larger than its whole budget.
    """
    over = []
    for device, nbytes in reserves.items():
        budget = budgets.get(device)
        weights = plan.per_device_bytes.get(device, 0)
        if budget is not None and nbytes and weights + nbytes > budget:
            over.append(
                f"{device_label(device)} needs {format_nbytes(weights)} of weights + "
                f"{format_nbytes(nbytes)} of reserve, over its {format_nbytes(budget)} budget"
            )
    if over:
        raise MemoryBudgetError(
            "no map fits: " + "; ".join(over) + "; give the devices more memory or plan for a "
            "shorter context"
        )


def get_balanced_memory(
    model: nn.Module,
    max_memory: Mapping[DeviceValue, int | str] | None = None,
    no_split_module_classes: Iterable[str] | str | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    low_zero: bool = False,
) -> dict[Device, int]:
    """Budgets that spread the model evenly over the GPUs, for ``infer_auto_device_map``.

    Each GPU but the last gets ``total / n_gpus`` plus a margin of 1.25 x the larger of the
    biggest no-split block and the mean leaf-module size (so blocks do not spill); the last
    keeps its full budget. With ``low_zero``, GPU 0 gets only what the others cannot hold.
    With ``max_memory=None`` and one GPU, 90% of it is used, leaving 10% for activations.

    Returns:
        A new budget dict (the caller's is not changed).

    Example:
        >>> model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)])  # 4 x 80 B
        >>> get_balanced_memory(model, {0: 1000, 1: 1000, "cpu": 1000})  # 320 / 2 + 1.25 * 80
        {0: 260, 1: 1000, 'cpu': 1000}
    """
    no_split = _no_split_set(no_split_module_classes)
    index = build_planner_index(model, dtype, special_dtypes, no_split)
    budgets = get_max_memory(max_memory)
    return _balanced(index, budgets, no_split, low_zero, max_memory is None)


def _balanced(
    index: ModuleIndex,
    budgets: dict[Device, int],
    no_split: set[str],
    low_zero: bool,
    detected: bool,
) -> dict[Device, int]:
    budgets = dict(budgets)
    gpus = [d for d, nbytes in budgets.items() if isinstance(d, int) and nbytes > 0]
    if not gpus:
        return budgets
    if len(gpus) == 1:
        low_zero = False
        if detected:
            budgets[gpus[0]] = int(budgets[gpus[0]] * 0.9)
    total = index.sizes[0]
    per_gpu = total // (len(gpus) - 1 if low_zero else len(gpus))
    block_nbytes = index.largest_block(no_split)
    leaf_count, leaf_total = index.leaf_stats()
    margin = int(1.25 * max(block_nbytes, leaf_total // max(leaf_count, 1)))
    per_gpu += margin
    for gpu in gpus[:-1]:
        budgets[gpu] = min(per_gpu, budgets[gpu])
    if low_zero:
        others = sum(budgets[gpu] for gpu in gpus[1:])
        budgets[gpus[0]] = min(max(0, total - others), budgets[gpus[0]])
    return budgets


def _no_split_set(classes: Iterable[str] | str | None) -> set[str]:
    if classes is None:
        return set()
    if isinstance(classes, str):
        return {classes}
    return set(classes)


def _reserve_bytes(reserve: Mapping[DeviceValue, int | str] | None) -> dict[Device, int]:
    return {
        normalize_device(device): convert_file_size_to_int(nbytes)
        for device, nbytes in (reserve or {}).items()
    }


def _plan(
    model: nn.Module,
    *,
    max_memory: Mapping[DeviceValue, int | str] | None,
    strategy: str,
    no_split_module_classes: Iterable[str] | str | None,
    dtype: torch.dtype | str | None,
    special_dtypes: Mapping[str, torch.dtype | str] | None,
    reserve: Mapping[DeviceValue, int | str] | None,
    offload_buffers: bool,
    fallback_allocation: bool,
    clean_result: bool,
    explain: bool,
    module_sizes: Mapping[str, int] | None,
    charges: Mapping[str, int] | None = None,
    module_index: ModuleIndex | None = None,
) -> tuple[PlanResult, dict[Device, int]]:
    """One placement; returns the plan (weights only per device) and the bytes of
    ``charges`` each device received with its modules."""
    if strategy not in STRATEGIES:
        raise BadInputError(
            f"unknown planning strategy {strategy!r}; use one of {', '.join(STRATEGIES)}"
        )
    no_split = _no_split_set(no_split_module_classes)
    if module_index is not None and (
        not module_index.modules or module_index.modules[0] is not model
    ):
        raise BadInputError("module_index is not an index of this model; build it from the model")
    if module_index is None and module_sizes is None and not charges:
        index = build_planner_index(model, dtype, special_dtypes, no_split)
    else:  # sizes overridden or charged by name: every module must be numbered
        if module_index is not None:  # the caller's, walked once: change a copy's sizes only
            index = module_index.resized(list(module_index.sizes))
        else:
            index = ModuleIndex.build(model, dtype=dtype, special_dtypes=special_dtypes)
        if module_sizes is not None:
            _override_sizes(index, module_sizes)
        if charges:
            apply_charges(index, charges)
    budgets = get_max_memory(max_memory)
    reserves = _reserve_bytes(reserve)
    unknown = sorted(map(str, set(reserves) - set(budgets) - {"disk"}))
    if unknown:
        raise BadInputError(
            f"reserve names devices without a budget: {', '.join(unknown)}; add them to max_memory"
        )
    net = {device: max(0, nbytes - reserves.get(device, 0)) for device, nbytes in budgets.items()}
    if strategy != "sequential":
        net = _balanced(index, net, no_split, strategy == "balanced_low_0", max_memory is None)
    devices = list(net)
    capacities: dict[Device, int | None] = dict(net)
    if "disk" not in capacities:
        devices.append("disk")
        capacities["disk"] = None
    outcome = run_placement(
        index,
        devices,
        capacities,
        reserves,
        no_split,
        fallback_allocation=fallback_allocation,
        explain=explain,
    )
    device_map = dict(outcome.assignments)
    if clean_result:
        device_map = clean_device_map(device_map)
    if not offload_buffers:
        held = {
            device: nbytes + outcome.reserved_nbytes.get(device, 0)
            for device, nbytes in outcome.used_nbytes.items()
        }
        _warn_offloaded_buffers(outcome.offloaded_buffer_nbytes, capacities, held)
    _log_unfilled_devices(outcome.unfilled_nbytes)
    charges = charges or {}
    counted = charged_by_device(outcome.assignments, charges) if charges else {}
    per_device = {
        device: nbytes - counted.get(device, 0)
        for device, nbytes in outcome.used_nbytes.items()
        if nbytes - counted.get(device, 0)
    }
    trace = []
    for record in outcome.records:
        charge = charge_within(record.name, charges) if charges else 0
        reason = record.reason
        if charge:
            reason += f" ({format_nbytes(charge)} of the size needed is KV cache)"
        trace.append(Placement(record.name, record.device, record.nbytes - charge, reason))
    return PlanResult(device_map=device_map, per_device_bytes=per_device, trace=trace), counted


def _override_sizes(index: ModuleIndex, module_sizes: Mapping[str, int]) -> None:
    for position in range(len(index.sizes)):
        nbytes = module_sizes.get(index.name_of(position))
        if nbytes is not None:
            index.sizes[position] = int(nbytes)


def _log_unfilled_devices(unfilled: Mapping[Device, int]) -> None:
    """Log (INFO, as the reference) the devices that got nothing and what they would need."""
    if not unfilled:
        return
    needs = "; ".join(
        f"{device_label(device)}: {format_nbytes(nbytes)} ({nbytes} B) required"
        for device, nbytes in unfilled.items()
    )
    logger.info(
        "no module could be placed on %d device(s) because of insufficient memory: %s. The first "
        "module tried there (with the room kept for the largest offloaded layer) needed that "
        "much; give those devices at least as much, or pass fallback_allocation=True.",
        len(unfilled),
        needs,
    )


def _warn_offloaded_buffers(
    buffer_nbytes: int, capacities: Mapping[Device, int | None], used: Mapping[Device, int]
) -> None:
    """Warn when the buffers of offloaded modules (they stay on the execution device) fit no
    GPU: ``used`` counts what each GPU holds plus the room kept there for offloaded layers."""
    gpus = [d for d in capacities if d not in ("cpu", "disk")]
    if not buffer_nbytes or not gpus:
        return
    if any((capacities[gpu] or 0) - used.get(gpu, 0) >= buffer_nbytes for gpu in gpus):
        return
    warnings.warn(
        f"offloaded modules hold {format_nbytes(buffer_nbytes)} of buffers, which stay on the "
        f"execution device, and no GPU ({', '.join(device_label(g) for g in gpus)}) has that much "
        "left; pass offload_buffers=True or give the GPUs more memory",
        UserWarning,
        stacklevel=3,
    )
