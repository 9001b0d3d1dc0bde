"""Layerwise casting: keep weights in a small dtype, compute in a wide one.

Weights of ``Linear``/``Conv*`` layers are stored in ``storage_dtype`` (e.g. fp8, 1 B/element)
and up-cast to ``compute_dtype`` (e.g. bf16) only for the duration of each layer's forward.

Unlike Accelerate and diffusers, which call ``module.to(compute)`` before the forward and
``module.to(storage)`` after it (two full passes over the weights, the second one a lossy
down-cast of values that were never changed), the hook here swaps an up-cast *copy* into the
module for the forward and puts the untouched storage tensor back afterwards: one cast per
weight, no cast-back pass, and nothing to lose when the forward raises.

Example:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    >>> attach_layerwise_casting_hooks(model, torch.float8_e4m3fn, torch.float32)
    >>> model[0].weight.dtype, model[1].weight.dtype
    (torch.float8_e4m3fn, torch.float32)
    >>> model(torch.ones(2, 4)).dtype
    torch.float32
"""

from __future__ import annotations

import functools
import logging
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from workbench.big_modeling.constants import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.hooks.base import ModelHook, add_hook_to_module
from workbench.big_modeling.hooks.casting_kernels import fp8_upcast_cpu_into, fp8_upcast_triton
from workbench.big_modeling.hooks.casting_scratch import ScratchPool

logger = logging.getLogger(__name__)

# The layers that get a hook (the reference's tuple); others keep their dtype.
SUPPORTED_LAYER_CLASSES = SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING

# Stock forwards: their output never aliases the weight, so the copy's buffer can be reused.
_STOCK_FORWARDS = frozenset(cls.forward for cls in SUPPORTED_LAYER_CLASSES)

# One swap: (the dict holding the tensor, its key, the storage tensor, the up-cast copy,
# whether the copy's buffer goes back to a ScratchPool).
_Swap = tuple[dict[str, Any], str, torch.Tensor, torch.Tensor, bool]

_FAST_UPCAST_MIN_NUMEL = 1 << 22  # CUDA, 4M elements: the kernel saves >= 6 us of GPU time there
_CPU_FAST_UPCAST_MIN_NUMEL = 1 << 16  # CPU, 64K elements: a bias gains nothing from the table


def _upcast(
    stored: torch.Tensor,
    compute_dtype: torch.dtype,
    non_blocking: bool,
    fp8_kernel: str,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``stored.to(compute_dtype)`` (into ``out`` when given), or a faster exact fp8 kernel.

    On CUDA ``fp8_kernel="auto"`` picks per call: the Triton kernel halves the GPU time of the
    cast but its launch costs ~30 us more host time than ``Tensor.to``. So it is used only when
    the GPU is the bottleneck, i.e. when the current stream still has queued work (``query()``
    is False); when the host is the bottleneck (small batches: the stream drains between
    launches) ``Tensor.to`` is cheaper. On CPU the table look-up is always cheaper (~5x) for big
    fp8 weights. Small tensors (biases) always use ``Tensor.to``; so does a weight that autograd
    must differentiate through.
    """
    fast_ok = fp8_kernel != "never" and not (stored.requires_grad and torch.is_grad_enabled())
    if (
        fast_ok
        and out is None
        and stored.dtype == torch.float8_e4m3fn
        and stored.is_cuda
        and stored.numel() >= _FAST_UPCAST_MIN_NUMEL
        and (fp8_kernel == "always" or not torch.cuda.current_stream(stored.device).query())
    ):
        fast = fp8_upcast_triton(stored, compute_dtype)
        if fast is not None:
            return fast
    if (
        fast_ok
        and stored.element_size() == 1  # fp8 of any flavour: the table has 256 entries
        and stored.device.type == "cpu"
        and stored.numel() >= _CPU_FAST_UPCAST_MIN_NUMEL
    ):
        target = out if out is not None else torch.empty_like(stored, dtype=compute_dtype)
        if fp8_upcast_cpu_into(stored, target):
            return target
    if out is not None:
        return out.copy_(stored, non_blocking=non_blocking)
    return stored.to(compute_dtype, non_blocking=non_blocking)


_FP8_KERNEL_CHOICES = ("auto", "always", "never")


def _check_fp8_kernel(value: str) -> str:
    if value not in _FP8_KERNEL_CHOICES:
        raise BadInputError(
            f"layerwise casting: fp8_kernel must be one of {', '.join(_FP8_KERNEL_CHOICES)}; "
            f"got {value!r}."
        )
    return value


def _check_dtype(value: object, role: str) -> torch.dtype:
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise BadInputError(
            f"layerwise casting: {role} must be a floating torch.dtype such as "
            f"torch.float8_e4m3fn or torch.bfloat16, got {value!r}."
        )
    return value


class LayerwiseCastingHook(ModelHook):
    """Stores a module's floating weights in ``storage_dtype``; computes in ``compute_dtype``.

    ``init_hook`` casts the module's floating parameters and buffers to ``storage_dtype``.
    Each forward replaces them with ``compute_dtype`` copies and restores the storage tensors
    afterwards (also when the forward raises). Non-floating tensors are never touched. Gradients
    flow to the stored parameters when their dtype supports autograd.

    With a ``scratch`` pool, forwards on CPU with autograd off copy into reused buffers instead
    of allocating (see ``casting_scratch``): pass one only for modules whose forward keeps no
    reference to its weights (``attach_layerwise_casting_hooks`` does so for stock layers).

    Args:
        storage_dtype: the dtype weights live in between forwards.
        compute_dtype: the dtype the forward sees.
        non_blocking: passed to ``Tensor.to`` for the casts.
        fp8_kernel: keyword-only extra; ``"auto"`` (default) up-casts big ``float8_e4m3fn``
            CUDA weights to bf16/fp16 with a Triton kernel (bit-exact, 2x faster on the GPU)
            when the GPU is the bottleneck; ``"always"`` / ``"never"`` force the choice.
            On CPU, ``"auto"`` and ``"always"`` up-cast big fp8 weights by an exact table look-up
            (~5x faster than PyTorch's scalar fp8 cast). ``"never"``: always ``Tensor.to``.
        scratch: keyword-only extra; a ``ScratchPool`` shared by the hooks of one model.

    Raises:
        BadInputError: when either dtype is not a floating dtype, or ``fp8_kernel`` is unknown.

    Example:
        >>> import torch
        >>> from workbench.big_modeling import add_hook_to_module
        >>> layer = torch.nn.Linear(2, 2)
        >>> hook = LayerwiseCastingHook(torch.bfloat16, torch.float32, non_blocking=False)
        >>> _ = add_hook_to_module(layer, hook)
        >>> layer.weight.dtype, layer(torch.ones(1, 2)).dtype
        (torch.bfloat16, torch.float32)
    """

    def __init__(
        self,
        storage_dtype: torch.dtype,
        compute_dtype: torch.dtype,
        non_blocking: bool,
        *,
        fp8_kernel: str = "auto",
        scratch: ScratchPool | None = None,
    ) -> None:
        self.storage_dtype = _check_dtype(storage_dtype, "storage_dtype")
        self.compute_dtype = _check_dtype(compute_dtype, "compute_dtype")
        self.non_blocking = non_blocking
        self.fp8_kernel = _check_fp8_kernel(fp8_kernel)
        self.scratch = scratch
        self._slots: list[tuple[dict[str, Any], str]] = []
        self._active: list[list[_Swap]] = []  # a stack: re-entrant forwards nest
        self._inner_forward: Callable[..., Any] | None = None

    def init_hook(self, module: nn.Module) -> nn.Module:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        # The slots are fixed now; what they hold is read per forward, because another hook
        # (e.g. an offloading one) may have replaced a tensor since.
        self._slots = [
            (tensors, name)
            for sub in module.modules()
            for tensors in (sub._parameters, sub._buffers)
            for name, tensor in tensors.items()
            if tensor is not None and tensor.is_floating_point()
        ]
        if any(tensors[name].device.type == "meta" for tensors, name in self._slots):
            warnings.warn(
                f"layerwise casting on {type(module).__name__}: its weights are on 'meta' "
                "(offloaded or not loaded yet), so they cannot be stored in "
                f"{self.storage_dtype}; the forward still computes in {self.compute_dtype}. "
                "Attach layerwise casting before offloading, after loading the weights.",
                stacklevel=2,
            )
        inner = module.__dict__.get("_old_forward")
        if inner is not None:
            # Cast inside the hooked forward, after every hook's pre_forward has run, so the
            # result does not depend on whether an offloading hook was added before or after.
            self._inner_forward = inner
            module._old_forward = functools.update_wrapper(
                functools.partial(self._cast_forward, inner), inner
            )
        return module

    def _swap_in(self) -> list[_Swap]:
        """Replace each stored floating tensor with a ``compute_dtype`` copy; return the swaps."""
        compute_dtype = self.compute_dtype
        # no graph may save a copy whose buffer the next layer overwrites
        pool = None if torch.is_grad_enabled() else self.scratch
        swaps: list[_Swap] = []
        try:
            for tensors, name in self._slots:
                stored = tensors.get(name)
                if (
                    stored is None
                    or stored.dtype == compute_dtype
                    or not stored.is_floating_point()
                    or stored.device.type == "meta"
                ):
                    continue
                pooled = pool is not None and stored.device.type == "cpu"
                out = pool.take(stored, compute_dtype) if pooled else None
                upcast = _upcast(stored, compute_dtype, self.non_blocking, self.fp8_kernel, out)
                tensors[name] = upcast
                swaps.append((tensors, name, stored, upcast, pooled))
        except BaseException:
            self._restore(swaps)
            raise
        return swaps

    def _cast_forward(self, inner: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        swaps = self._swap_in()
        try:
            return inner(*args, **kwargs)
        finally:
            self._restore(swaps)

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        # Attached through add_hook_to_module the casts happen in ``_cast_forward``; a hook
        # driven by hand (pre_forward, forward, post_forward) swaps here instead.
        if self._inner_forward is None:
            self._active.append(self._swap_in())
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        if self._inner_forward is None and self._active:
            self._restore(self._active.pop())
        return output

    def forward_failed(self, module: nn.Module, error: BaseException) -> None:
        if self._inner_forward is None and self._active:
            self._restore(self._active.pop())

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Unwraps the forward and puts back any storage tensors still swapped out.

        Weights stay in ``storage_dtype``, as in the reference.
        """
        while self._active:
            self._restore(self._active.pop())
        wrapper = module.__dict__.get("_old_forward")
        if self._inner_forward is not None and getattr(wrapper, "func", None) == self._cast_forward:
            module._old_forward = self._inner_forward
        self._inner_forward = None
        self._slots = []
        return module

    def _restore(self, swaps: list[_Swap]) -> None:
        """Put storage tensors back, unless something else replaced the copy meanwhile.

        An outer hook (e.g. an offloading one) may have swapped the tensor for ``meta`` after
        the forward; then the slot is theirs and is left alone, and so is the copy: only a
        buffer this hook took back out of the module returns to the pool.
        """
        for tensors, name, stored, upcast, pooled in reversed(swaps):
            if tensors.get(name) is upcast:
                tensors[name] = stored
                if pooled and self.scratch is not None:
                    self.scratch.give_back(stored, upcast)

    def _repr_fields(self) -> dict[str, Any]:
        return {
            "storage_dtype": self.storage_dtype,
            "compute_dtype": self.compute_dtype,
            "non_blocking": self.non_blocking,
            "fp8_kernel": self.fp8_kernel,
        }


def _compile_patterns(patterns: str | Sequence[str] | None) -> list[re.Pattern[str]]:
    if patterns is None:
        return []
    if isinstance(patterns, str):
        patterns = (patterns,)  # one pattern, never its characters
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except (re.error, TypeError) as exc:
            raise BadInputError(
                f"skip_modules_pattern: {pattern!r} is not a valid regular expression ({exc}); "
                "pass regex strings such as 'norm' or '^proj_out$'."
            ) from exc
    return compiled


def _class_tuple(classes: type | Sequence[type] | None) -> tuple[type, ...]:
    if classes is None:
        return ()
    if isinstance(classes, type):
        return (classes,)
    classes = tuple(classes)
    bad = sorted(repr(c) for c in classes if not isinstance(c, type))
    if bad:
        raise BadInputError(
            f"skip_modules_classes must hold module classes; not classes: {', '.join(bad)}."
        )
    return classes


def attach_layerwise_casting_hooks(
    module: nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: str | tuple[str, ...] | None = None,
    skip_modules_classes: tuple[type[nn.Module], ...] | None = None,
    non_blocking: bool = False,
    *,
    fp8_kernel: str = "auto",
) -> None:
    """Attach a ``LayerwiseCastingHook`` to every ``Linear``/``Conv*`` layer of ``module``.

    Modules are visited from the root; a module whose dotted name matches a pattern
    (``re.search``) or whose class is listed is skipped together with its whole subtree. Hooks
    are appended to hooks already attached (e.g. an ``AlignDevicesHook``), so they run after
    them: weights are brought to the device first, then up-cast.

    Args:
        module: the model.
        storage_dtype: dtype the weights are stored in (e.g. ``torch.float8_e4m3fn``).
        compute_dtype: dtype used for the forward (e.g. ``torch.bfloat16``).
        skip_modules_pattern: one regex string or a sequence of them (``"norm"`` is one
            pattern, not four characters). None skips nothing by name: norms are not hooked
            anyway because only ``SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING`` are. The reference's docstring
            says None applies casting "directly to the module"; like its implementation we
            still hook the supported layers inside it.
        skip_modules_classes: module classes (a class or a tuple) to skip.
        non_blocking: passed to ``Tensor.to`` for the casts.
        fp8_kernel: keyword-only extra, see ``LayerwiseCastingHook``.

    Raises:
        BadInputError: non-floating dtypes, an invalid pattern, non-class entries, or an
            unknown ``fp8_kernel``.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        >>> attach_layerwise_casting_hooks(
        ...     model, torch.float8_e4m3fn, torch.bfloat16, skip_modules_pattern=r"^1$"
        ... )
        >>> model[0].weight.dtype, model[1].weight.dtype
        (torch.float8_e4m3fn, torch.float32)
    """
    _check_dtype(storage_dtype, "storage_dtype")
    _check_dtype(compute_dtype, "compute_dtype")
    _check_fp8_kernel(fp8_kernel)
    patterns = _compile_patterns(skip_modules_pattern)
    skip_classes = _class_tuple(skip_modules_classes)
    scratch = ScratchPool()  # shared by this model's hooks; freed with them
    pending: list[tuple[str, nn.Module]] = [("", module)]
    hooked: list[str] = []
    while pending:
        name, current = pending.pop()
        if isinstance(current, skip_classes) or any(p.search(name) for p in patterns):
            logger.debug("layerwise casting: skipping %r", name)
            continue
        if isinstance(current, SUPPORTED_LAYER_CLASSES):
            stock = type(current).forward in _STOCK_FORWARDS
            hook = LayerwiseCastingHook(
                storage_dtype,
                compute_dtype,
                non_blocking,
                fp8_kernel=fp8_kernel,
                scratch=scratch if stock else None,
            )
            add_hook_to_module(current, hook, append=True)
            hooked.append(name)
            continue
        children = [
            (f"{name}.{child}" if name else child, sub) for child, sub in current.named_children()
        ]
        pending.extend(reversed(children))
    logger.debug("layerwise casting: hooked %d layers", len(hooked))
