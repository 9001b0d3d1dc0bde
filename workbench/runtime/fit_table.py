"""What fits where: for an opened model, every hardware profile by context length.

One cell per (profile, context): the plan ``plan_opened_model`` makes with the memory model
(``MemoryOptions(context=..., prefill_tokens=...)``: each device keeps free the KV cache of the
layers it runs plus their activation peak, for a prefill of the whole context or, with
``prefill_tokens``, of one chunk of it) and the speed ``predict_speed`` predicts for it, decode
tokens/s and the time to first token of a prompt that fills the context. A cell says one of:

- ``full GPU``: every weight on accelerators;
- ``partial offload``: ``gpu_layers`` of ``layer_count`` decoder layers on accelerators, the
  rest in RAM (or on disk), streamed to the GPU each forward;
- ``CPU only``: no weight on an accelerator (the profile has none, or its GPUs cannot hold the
  KV cache that offloaded layers keep on the GPU that runs them, so the CPU runs everything);
- ``does not fit``: no map holds the weights and the reserves (``problem`` says why).

Contexts are 4k, 32k and 128k tokens and the model's maximum, each only when the model
supports it. The GUI computes the table on a worker thread (``iter_fit_cells`` yields cell
by cell); a 70B config on 4 profiles x 3 contexts plans on meta tensors only.

Example:
    >>> table = fit_table(open_model("llama-3.1-8b"))  # doctest: +SKIP
    >>> table.cell("h200-141gb", 4096).label()  # doctest: +SKIP
    'full GPU'
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, Literal

from workbench.big_modeling.devices import device_label
from workbench.big_modeling.errors import BadInputError, MemoryBudgetError
from workbench.big_modeling.planning.attention_kinds import AttentionKindWarning
from workbench.big_modeling.planning.device_reserve import layer_devices_from_map
from workbench.big_modeling.planning.sizes import format_nbytes
from workbench.models.hardware import HardwareProfile, list_profiles
from workbench.runtime.formatting import format_rate, format_seconds
from workbench.runtime.machine_attention import ATTENTION_ESTIMATED, predict_on_screen
from workbench.runtime.model_kind import generates_tokens
from workbench.runtime.planning import MemoryOptions, attention_layout, plan_opened_model

if TYPE_CHECKING:
    from workbench.models.intake import OpenedModel

FIT_CONTEXTS: Final = (4096, 32768, 131072)
FULL_GPU: Final = "full GPU"
PARTIAL: Final = "partial offload"
CPU_ONLY: Final = "CPU only"
NO_FIT: Final = "does not fit"
GPUS_UNUSED: Final = (
    "the GPUs are unused: none holds a layer beside the KV cache and activations it needs here"
)
FitStatus = Literal["full GPU", "partial offload", "CPU only", "does not fit"]


@dataclass(frozen=True)
class FitCell:
    """One profile at one context length.

    Attributes:
        profile: the hardware profile's name.
        context: tokens the KV cache holds (and the prompt the TTFT is for).
        status: ``FULL_GPU``, ``PARTIAL``, ``CPU_ONLY`` or ``NO_FIT``.
        gpu_layers: decoder layers whose weights live on an accelerator.
        layer_count: decoder layers of the model.
        disk_layers: decoder layers offloaded to disk.
        tokens_per_s: predicted decode tokens/s (``None`` when it does not fit).
        ttft_s: predicted time to first token for a ``context``-token prompt.
        forward_s: predicted time of one forward over ``context`` tokens.
        generates: whether the model generates tokens (``runtime.model_kind``); one that does
            not (BERT) runs one forward, so its speed is ``forward_s``, not tokens/s and TTFT.
        device_map: the plan (empty when it does not fit).
        budgets: the budgets planned for (the profile's, or its CPU and disk for CPU only).
        reserve: bytes each device keeps free (KV cache + activation peak).
        why: the memory model's reason per device ("layers 0-79 on cuda:0 need 40 GiB ...").
        problem: why it does not fit, or why the GPUs are unused; ``""`` otherwise.
        notes: the planner's warnings for this plan (buffers left on the execution device),
            and whether this machine's CPU attention is estimated (``machine_attention.predict_on_screen``).
    """

    profile: str
    context: int
    status: FitStatus
    gpu_layers: int = 0
    layer_count: int = 0
    disk_layers: int = 0
    tokens_per_s: float | None = None
    ttft_s: float | None = None
    forward_s: float | None = None
    generates: bool = True
    device_map: dict[str, Any] = field(default_factory=dict)
    budgets: dict[Any, int] = field(default_factory=dict)
    reserve: dict[Any, int] = field(default_factory=dict)
    why: tuple[str, ...] = ()
    problem: str = ""
    notes: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.status != NO_FIT

    def label(self) -> str:
        """The status in a few words: ``"partial: 52 of 80 layers on GPU"``, ``"full GPU"``."""
        if self.status == PARTIAL:
            disk = f", {self.disk_layers} on disk" if self.disk_layers else ""
            return f"partial: {self.gpu_layers} of {self.layer_count} layers on GPU{disk}"
        if self.status == CPU_ONLY and self.disk_layers:
            return f"{CPU_ONLY} + disk ({self.disk_layers} of {self.layer_count} layers on disk)"
        return self.status

    def speed_text(self) -> str:
        """``"27.2 tok/s · TTFT 1.2 s"``; ``"forward 3.1 ms"`` for a model that generates
        nothing; ``""`` when it does not fit."""
        if not self.generates:
            return "" if self.forward_s is None else f"forward {format_seconds(self.forward_s)}"
        if self.tokens_per_s is None or self.ttft_s is None:
            return ""
        return f"{format_rate(self.tokens_per_s)} · TTFT {format_seconds(self.ttft_s)}"

    def to_dict(self) -> dict[str, Any]:
        """JSON data: devices as in a device map (``0``, ``"cpu"``), byte counts as ints."""
        return {
            "profile": self.profile,
            "context": self.context,
            "status": self.status,
            "label": self.label(),
            "gpu_layers": self.gpu_layers,
            "layer_count": self.layer_count,
            "disk_layers": self.disk_layers,
            "tokens_per_s": self.tokens_per_s,
            "ttft_s": self.ttft_s,
            "forward_s": self.forward_s,
            "generates": self.generates,
            "budgets": {str(d): n for d, n in self.budgets.items()},
            "reserve": {str(d): n for d, n in self.reserve.items()},
            "why": list(self.why),
            "problem": self.problem,
            "notes": list(self.notes),
            "device_map": self.device_map,
        }


@dataclass(frozen=True)
class FitTable:
    """Every profile by every context for one model.

    Attributes:
        model: the model's label.
        contexts: the columns, ascending.
        profiles: the rows.
        cells: row by row, one per (profile, context).
        warnings: config keys the memory model did not understand (dense fallback).
        prefill_tokens: the prefill chunk the reserves are for (``None``: the whole context).
    """

    model: str
    contexts: tuple[int, ...]
    profiles: tuple[HardwareProfile, ...]
    cells: tuple[FitCell, ...]
    warnings: tuple[str, ...] = ()
    prefill_tokens: int | None = None

    def cell(self, profile: str, context: int) -> FitCell:
        """The cell of ``profile`` at ``context``.

        Raises:
            KeyError: naming the profile and context when the table has no such cell.
        """
        for cell in self.cells:
            if cell.profile == profile and cell.context == context:
                return cell
        raise KeyError(f"the fit table has no cell for profile {profile!r} at {context} tokens")

    def profile(self, name: str) -> HardwareProfile:
        """The row's profile by name (``KeyError`` when the table has none)."""
        for profile in self.profiles:
            if profile.name == name:
                return profile
        raise KeyError(f"the fit table has no profile {name!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "contexts": list(self.contexts),
            "profiles": [
                {
                    "name": p.name,
                    "description": p.description,
                    "budgets": {str(d): n for d, n in p.budgets().items()},
                    "budget_description": p.budget_description(),
                }
                for p in self.profiles
            ],
            "cells": [cell.to_dict() for cell in self.cells],
            "warnings": list(self.warnings),
            "prefill_tokens": self.prefill_tokens,
        }


def context_label(context: int) -> str:
    """``4096`` -> ``"4k"``, ``131072`` -> ``"128k"``, ``1000`` -> ``"1000"``."""
    return f"{context // 1024}k" if context % 1024 == 0 else str(context)


def fit_contexts(opened: OpenedModel) -> tuple[int, ...]:
    """The columns for ``opened``: 4k, 32k, 128k up to the model's maximum, and the maximum
    itself (every fixed column when the config states none).

    Raises:
        BadInputError: a config the memory model cannot read.
    """
    maximum = attention_layout(opened).max_position_embeddings
    contexts = [c for c in FIT_CONTEXTS if maximum is None or c <= maximum]
    if maximum is not None and maximum not in contexts:
        contexts.append(maximum)
    return tuple(sorted(contexts))


def fit_cell(
    opened: OpenedModel,
    profile: HardwareProfile,
    context: int,
    *,
    prefill_tokens: int | None = None,
) -> FitCell:
    """Plan ``opened`` on ``profile`` for ``context`` tokens and predict its speed.

    Tries the whole profile first; when that does not fit and the profile has GPUs, tries its
    CPU and disk alone (a GPU too small for the KV cache of the layers it would run).

    Args:
        prefill_tokens: the prefill chunk the activation reserve is for (``MemoryOptions``);
            ``None``: the whole context. The TTFT is still for a context-long prompt.

    Raises:
        BadInputError: a config the memory model cannot read, or a non-positive prefill.
    """
    memory = MemoryOptions(context=context, prefill_tokens=prefill_tokens)
    budgets = profile.budgets()
    try:
        return _planned_cell(opened, profile, context, memory, budgets)
    except MemoryBudgetError as exc:
        problem = str(exc)
    host_only = {d: n for d, n in budgets.items() if not isinstance(d, int)}
    if profile.accelerators and host_only:
        try:
            cell = _planned_cell(opened, profile, context, memory, host_only)
        except MemoryBudgetError:
            pass
        else:
            return replace(cell, problem=f"{GPUS_UNUSED} ({problem})")
    return FitCell(
        profile.name,
        context,
        NO_FIT,
        budgets=budgets,
        problem=problem,
        generates=generates_tokens(opened),
    )


def _planned_cell(
    opened: OpenedModel,
    profile: HardwareProfile,
    context: int,
    memory: MemoryOptions,
    budgets: dict[Any, int],
) -> FitCell:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = plan_opened_model(opened, max_memory=budgets, memory=memory)
    # the table lists the attention-kind warnings once; the planner's belong to this cell
    notes = tuple(
        dict.fromkeys(
            str(w.message) for w in caught if not issubclass(w.category, AttentionKindWarning)
        )
    )
    _check_within_budgets(plan, budgets)
    layer_devices = layer_devices_from_map(plan.device_map, len(attention_layout(opened).layers))
    on_gpu = sum(1 for device in layer_devices if device.startswith("cuda"))
    on_disk = sum(1 for device in layer_devices if device == "disk")
    devices = set(plan.device_map.values())
    if all(isinstance(device, int) for device in devices):
        status: FitStatus = FULL_GPU
    elif any(isinstance(device, int) for device in devices):
        status = PARTIAL
    else:
        status = CPU_ONLY
    prediction, estimated = predict_on_screen(
        opened, opened.tree, plan.device_map, profile, prompt_tokens=context
    )
    if estimated:
        notes = (*notes, f"this machine's {ATTENTION_ESTIMATED}")
    return FitCell(
        profile=profile.name,
        context=context,
        status=status,
        gpu_layers=on_gpu,
        layer_count=len(layer_devices),
        disk_layers=on_disk,
        tokens_per_s=prediction.tokens_per_s,
        ttft_s=prediction.ttft_s,
        forward_s=prediction.prefill_s,
        generates=generates_tokens(opened),
        device_map=dict(plan.device_map),
        budgets=dict(budgets),
        reserve=dict(plan.reserve),
        why=tuple(plan.reserve_why.values()),
        problem=GPUS_UNUSED if status == CPU_ONLY and profile.accelerators else "",
        notes=notes,
    )


def _check_within_budgets(plan: Any, budgets: dict[Any, int]) -> None:
    """Refuse a plan whose weights plus reserve exceed a budget (a KV cache in RAM for layers
    that all went to disk, say): the table only calls a plan a fit when every device holds it."""
    over = [
        f"{device_label(device)} needs {format_nbytes(plan.per_device_bytes.get(device, 0))} "
        f"of weights + {format_nbytes(plan.reserve.get(device, 0))} reserve, budget "
        f"{format_nbytes(budget)}"
        for device, budget in budgets.items()
        if plan.per_device_bytes.get(device, 0) + plan.reserve.get(device, 0) > budget
    ]
    if over:
        raise MemoryBudgetError("; ".join(over))


def iter_fit_cells(
    opened: OpenedModel,
    profiles: Sequence[HardwareProfile],
    contexts: Sequence[int],
    *,
    prefill_tokens: int | None = None,
) -> Iterator[FitCell]:
    """Yield ``fit_cell`` for each profile (row by row) and context (for progress)."""
    for profile in profiles:
        for context in contexts:
            yield fit_cell(opened, profile, context, prefill_tokens=prefill_tokens)


def fit_table(
    opened: OpenedModel,
    profiles: Sequence[HardwareProfile] | None = None,
    contexts: Sequence[int] | None = None,
    on_cell: Callable[[FitCell], object] | None = None,
    *,
    prefill_tokens: int | None = None,
) -> FitTable:
    """The table for ``opened``: ``profiles`` (default: bundled and the user's,
    ``list_profiles()``) by ``contexts`` (default ``fit_contexts(opened)``).

    Args:
        on_cell: called with each cell when it is done (progress).
        prefill_tokens: the prefill chunk every cell's activation reserve is for (engines
            with chunked prefill); ``None``: a prefill of the whole context.

    Raises:
        BadInputError: a config the memory model cannot read (no decoder layers, no heads),
            or no profiles.
    """
    rows = tuple(list_profiles() if profiles is None else profiles)
    if not rows:
        raise BadInputError("no hardware profiles to fit; add one (see `workbench profiles`)")
    columns = tuple(sorted(fit_contexts(opened) if contexts is None else contexts))
    cells = []
    for cell in iter_fit_cells(opened, rows, columns, prefill_tokens=prefill_tokens):
        cells.append(cell)
        if on_cell is not None:
            on_cell(cell)
    warned = attention_layout(opened).warnings
    return FitTable(opened.label, columns, rows, tuple(cells), warned, prefill_tokens)
