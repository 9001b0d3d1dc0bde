"""Planning a device map for an opened model: the one path the planner panel and
``workbench plan`` share. No widgets here.

``plan_opened_model`` plans with the sizes the model's tree reports (checkpoint headers when
there are weights), so a plan's totals and the tree agree even for a checkpoint mixing dtypes.
With ``memory=MemoryOptions(...)`` each device keeps free what the memory model says the
planned map needs there (``device_reserves``: the KV cache of the layers it runs plus their
activation peak); the planner panel, the lanes and ``workbench plan`` all call
``device_reserves``, so they show the same numbers (``MemoryOptions.prefill_tokens`` sizes
the activation peak for one prefill chunk instead of the whole context). ``activation_reserve``
is the one-device figure for a prefill of a given shape.

Example:
    >>> opened = open_model("demo")  # doctest: +SKIP
    >>> plan = plan_opened_model(opened, max_memory={"cpu": 2**30}, strategy="auto")
    >>> sum(plan.per_device_bytes.values()) == opened.tree.root.nbytes
    True
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import torch

from workbench.big_modeling import PlanResult, estimate_activation_reserve, plan_device_map
from workbench.big_modeling.devices import device_label
from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.planning.attention_kinds import (
    AttentionKindWarning,
    AttentionLayout,
    read_attention_layout,
)
from workbench.big_modeling.planning.device_reserve import (
    DeviceReserve,
    layer_module_names,
    reserve_for_device_map,
)
from workbench.big_modeling.planning.kv_cache import ENGINES, default_context, kv_cache_per_layer
from workbench.big_modeling.planning.sizes import format_nbytes
from workbench.big_modeling.quantization.keep_high_precision import default_keep_high_precision
from workbench.big_modeling.quantization.sizes import QuantizableWeights, precision_of
from workbench.runtime.memory_prediction import (
    computes_with_dense_copy,
    dequantize_buffer_prediction,
)

if TYPE_CHECKING:
    from workbench.models.intake import OpenedModel

STRATEGIES: Final = ("auto", "balanced", "balanced_low_0", "sequential")

AS_OPENED: Final = "as opened"
"""``dtype=`` of ``plan_opened_model`` meaning "the dtype ``opened`` was opened in"."""

MODEL_DTYPE: Final = "model"
KV_DTYPES: Final = (MODEL_DTYPE, "fp16", "bf16", "fp8", "int8")
"""KV cache dtypes the memory model offers; ``"model"``: the dtype activations run in."""
KV_ENGINES: Final = tuple(ENGINES)
"""Whose MLA cache layout to count (``kv_cache.ENGINES``); other attention kinds ignore it."""
DEFAULT_CONTEXT_CAP: Final = 32768


@dataclass(frozen=True)
class MemoryOptions:
    """What the memory model plans for: the planner panel's controls, ``plan``'s flags.

    Attributes:
        batch: sequences generated together.
        context: tokens each sequence's cache holds; ``None``: the model's
            ``max_position_embeddings`` capped by ``context_cap`` (``kv_cache.default_context``).
        kv_dtype: one of ``KV_DTYPES``.
        engine: one of ``KV_ENGINES`` (MLA: transformers caches the latent, transformers-4
            the expanded heads).
        context_cap: the cap on the model's maximum context when ``context`` is ``None``.
        prefill_tokens: tokens one prefill forward processes, which sets the activation peak;
            ``None``: the whole context in one forward (``transformers``' ``generate``).
            Engines with chunked prefill (vLLM's ``max_num_batched_tokens``, llama.cpp's
            ``ubatch``: 512 to 8192 tokens) peak at their chunk size: give it here. A figure
            above the context counts as the context (``planned_prefill``).

    Raises:
        BadInputError: for a non-positive batch, context, cap or prefill, or an unknown dtype
            or engine.
    """

    batch: int = 1
    context: int | None = None
    kv_dtype: str = MODEL_DTYPE
    engine: str = "transformers"
    context_cap: int = DEFAULT_CONTEXT_CAP
    prefill_tokens: int | None = None

    def __post_init__(self) -> None:
        bad = [
            f"{name}={value}"
            for name, value in (
                ("batch", self.batch),
                ("context", self.context),
                ("context_cap", self.context_cap),
                ("prefill_tokens", self.prefill_tokens),
            )
            if value is not None and (not isinstance(value, int) or value < 1)
        ]
        if bad:
            raise BadInputError(f"memory options must be positive, got {', '.join(bad)}")
        if self.kv_dtype not in KV_DTYPES:
            raise BadInputError(
                f"unknown KV cache dtype {self.kv_dtype!r}; use one of {', '.join(KV_DTYPES)}"
            )
        if self.engine not in KV_ENGINES:
            raise BadInputError(
                f"unknown KV cache engine {self.engine!r}; use one of {', '.join(KV_ENGINES)}"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON data (a session file's ``"memory"``); ``from_dict`` reads it back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryOptions:
        """The options ``to_dict`` wrote; missing keys take their defaults.

        Raises:
            BadInputError: unknown keys, values of the wrong type, or bad figures.
        """
        fields = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(str(key) for key in data if key not in fields)
        if unknown:
            raise BadInputError(f"unknown memory options: {', '.join(unknown)}")
        wrong = [
            f"{key}={value!r:.40}"
            for key, value in data.items()
            if isinstance(value, bool)
            or (key in ("kv_dtype", "engine") and not isinstance(value, str))
            or (key not in ("kv_dtype", "engine") and not isinstance(value, (int, type(None))))
        ]
        if wrong:
            raise BadInputError(f"memory options of the wrong type: {', '.join(wrong)}")
        return cls(**data)


def attention_layout(opened: OpenedModel) -> AttentionLayout:
    """The decoder's layers as the memory model reads them from ``opened.config``, without
    warning; ``layout.warnings`` name the config keys that were not understood.

    Raises:
        BadInputError: a config without layer count, width or heads (or no config).
    """
    if opened.config is None:
        raise BadInputError(f"{opened.label} has no transformers config: no memory model")
    return read_attention_layout(opened.config, warn=False)


def attention_layout_or_none(opened: OpenedModel) -> AttentionLayout | None:
    """``attention_layout(opened)``, or ``None`` for a model the memory model cannot read
    (the speed model then leaves attention out)."""
    if getattr(opened, "config", None) is None:
        return None
    try:
        return attention_layout(opened)
    except BadInputError:
        return None


def planned_context(opened: OpenedModel, options: MemoryOptions) -> int:
    """The context ``options`` plan for: its own, else the model's maximum capped."""
    if options.context is not None:
        return options.context
    return default_context(attention_layout(opened), options.context_cap)


def planned_prefill(opened: OpenedModel, options: MemoryOptions) -> int:
    """The tokens of one prefill forward ``options`` plan for: ``prefill_tokens``, at most the
    planned context (all of it when ``prefill_tokens`` is ``None``)."""
    context = planned_context(opened, options)
    return context if options.prefill_tokens is None else min(options.prefill_tokens, context)


def _token_words(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 and tokens >= 1024 else str(tokens)


def _activation_dtype(opened: OpenedModel) -> torch.dtype:
    dtype = planning_dtype(opened)
    if dtype is None or not dtype.is_floating_point:
        dtype = opened.declared_dtype
    return dtype if dtype is not None and dtype.is_floating_point else torch.float16


def device_reserves(
    opened: OpenedModel,
    device_map: Mapping[str, Any],
    options: MemoryOptions,
    precision_map: Mapping[str, str] | None = None,
) -> dict[Any, DeviceReserve]:
    """What each device must keep free to run ``device_map``: the one function the planner,
    the lanes and ``workbench plan`` use.

    Per device (layers mapped to cpu/disk run on the map's first accelerator, as dispatch
    runs them): the KV cache of its layers at ``planned_context`` tokens in the KV dtype
    (``model``: the weights' floating dtype, else fp16), plus the activation peak of a
    prefill forward of ``planned_prefill`` tokens (the whole context unless
    ``prefill_tokens`` says a chunk; SDPA attention, logits of one position on the device of
    the last layer). ``DeviceReserve.why`` says it in words, naming the prefill when it is a
    chunk of the context. With nf4/fp4/int8 weights in ``precision_map`` (``{module prefix:
    precision}``), a device also keeps the dense copy of the largest one it runs
    (``memory_prediction.dequantize_buffer_prediction``, as a run's reconciliation counts it).

    Returns:
        ``{device-map device: DeviceReserve}`` for each device that runs decoder layers.

    Raises:
        BadInputError: no config, or one the memory model cannot read; a map that leaves a
            decoder layer on no device.
    """
    layout = attention_layout(opened)
    dtype = _activation_dtype(opened)
    context = planned_context(opened, options)
    prefill = planned_prefill(opened, options)
    reserves = reserve_for_device_map(
        layout,
        device_map,
        batch=options.batch,
        context=context,
        kv_dtype=None if options.kv_dtype == MODEL_DTYPE else options.kv_dtype,
        model_dtype=dtype,
        engine=options.engine,  # type: ignore[arg-type]
        prompt_tokens=prefill,
    )
    if prefill != context:
        chunk = f" for {_token_words(prefill)}-token prefill chunks"
        reserves = {d: dataclasses.replace(r, why=r.why + chunk) for d, r in reserves.items()}
    buffers = dequantize_buffer_prediction(
        opened.model, _dense_copy_modules(opened, precision_map or {}), device_map
    )
    for device, reserve in reserves.items():
        nbytes = buffers.get(device_label(device), 0)
        if nbytes:
            why = f"{reserve.why}; {format_nbytes(nbytes)} to dequantize its largest nf4/fp4/int8 weight"
            reserves[device] = dataclasses.replace(reserve, dequantize_nbytes=nbytes, why=why)
    return reserves


@dataclass
class _DenseCopyCache:
    opened: Any = None
    key: Any = None
    modules: dict[str, str] = dataclasses.field(default_factory=dict)


_DENSE_COPY = _DenseCopyCache()


def _dense_copy_modules(opened: OpenedModel, precision_map: Mapping[str, str]) -> dict[str, str]:
    """``{module: precision}`` of the modules ``precision_map`` (by prefix) makes nf4/fp4/int8:
    Linear and fused-expert weights outside the modules kept in high precision, as a load
    converts them (one entry: the GUI asks for the same model and map on every refresh)."""
    key = tuple(sorted(precision_map.items()))
    if _DENSE_COPY.opened is opened and _DENSE_COPY.key == key:
        return _DENSE_COPY.modules
    modules: dict[str, str] = {}
    if any(computes_with_dense_copy(precision) for precision in precision_map.values()):
        kept = [n for n in default_keep_high_precision(opened.model) if n not in precision_map]
        for tensor in QuantizableWeights.of(opened.model, kept).shapes:
            module = tensor.rpartition(".")[0]
            precision = precision_of(module, precision_map)
            if computes_with_dense_copy(precision):
                modules[module] = str(precision)
    _DENSE_COPY.opened, _DENSE_COPY.key, _DENSE_COPY.modules = opened, key, modules
    return modules


def layer_cache_charges(opened: OpenedModel, options: MemoryOptions) -> dict[str, int]:
    """Each decoder layer's KV cache by module name (``model.layers.3`` -> bytes): what the
    planner places with the layer (``plan_device_map``'s ``charges``).

    Raises:
        BadInputError: as ``device_reserves``.
    """
    layout = attention_layout(opened)
    layers = kv_cache_per_layer(
        layout,
        batch=options.batch,
        context=planned_context(opened, options),
        kv_dtype=None if options.kv_dtype == MODEL_DTYPE else options.kv_dtype,
        model_dtype=_activation_dtype(opened),
        engine=options.engine,  # type: ignore[arg-type]
    )
    names = layer_module_names((name for name, _ in opened.model.named_modules()), len(layers))
    return {name: layers[index].nbytes for index, name in names.items()}


def execution_reserve(opened: OpenedModel, options: MemoryOptions) -> int:
    """The reserve of the device that runs every layer (a map ``{"": device}``)."""
    (reserve,) = device_reserves(opened, {"": "cpu"}, options).values()
    return reserve.nbytes


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
    memory: MemoryOptions | None = None,
) -> PlanResult:
    """Plan ``opened`` for the budgets ``max_memory`` with the sizes its tree reports.

    Args:
        reserve: bytes kept free per device for activations (empty or ``None``: none).
        memory: plan with the memory model: each device also keeps free what
            ``device_reserves`` says the planned map needs there; each layer's cache is
            placed with the layer (``layer_cache_charges``), the rest found as
            ``plan_device_map``'s ``reserve_for_map`` fixed point. ``plan.reserve_why`` says
            why per device. Config keys the memory model did not understand raise one
            ``AttentionKindWarning``.
        no_split: module classes never split across devices; ``None``: the model's own.
        dtype: the dtype the planner counts weights in; ``AS_OPENED`` (the default): the one
            ``opened`` was opened in, or as stored; ``None``: the meta model's own.

    Raises:
        BadInputError: an unknown strategy or bad budgets; with ``memory``, a config the
            memory model cannot read.
        MemoryBudgetError: the model does not fit the budgets.
    """
    reserve_for_map, charges = None, None
    if memory is not None:
        layout = attention_layout(opened)
        for message in layout.warnings:
            warnings.warn(message, AttentionKindWarning, stacklevel=2)
        charges = layer_cache_charges(opened, memory)

        def reserve_for_map(device_map: Mapping[str, Any]) -> dict[Any, int]:
            return {d: r.nbytes for d, r in device_reserves(opened, device_map, memory).items()}

    plan = plan_device_map(
        opened.model,
        max_memory=dict(max_memory),
        strategy=strategy,  # type: ignore[arg-type]
        no_split_module_classes=list(opened.no_split_modules if no_split is None else no_split),
        dtype=_planner_dtype(opened) if dtype == AS_OPENED else dtype,
        reserve=dict(reserve) if reserve else None,
        # A what-if config has no stored sizes: the planner's lazy index is faster there.
        module_sizes=opened.module_sizes() if opened.has_weights else None,
        reserve_for_map=reserve_for_map,
        charges=charges,
    )
    if memory is None:
        return plan
    why = {d: r.why for d, r in device_reserves(opened, plan.device_map, memory).items()}
    return dataclasses.replace(plan, reserve_why=why)


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
