"""``AlignDevicesHook``: inputs and weights on the execution device for the forward; and the
questions about one module's offloaded tensors (``has_offloaded_params``, ``align_module_device``).

Without ``offload`` the hook moves the module's tensors to the execution device once (at
attach time) and moves inputs per forward. With ``offload`` the module's tensors are ``meta``
placeholders between forwards; ``pre_forward`` materialises them from ``weights_map`` and
``post_forward`` (or ``forward_failed`` when the forward raises) puts the placeholders back.

Beyond the reference:

- Persistent buffers of offloaded modules that are not themselves offloaded
  (``offload_buffers=False``) are served from ``weights_map`` when it holds them. Accelerate
  keeps the module's own buffers, so a BatchNorm mapped to disk silently runs with its
  *initial* running statistics.
- Zero copy: on a CPU execution device a stored tensor of the right dtype (an in-memory state
  dict entry, a memory-mapped offload file) is used in place.
- Every materialisation can be reported to ``workbench.big_modeling.transfers``' recorder.
- ``prefetcher`` (set by ``dispatch_model(..., prefetch=True)``) fetches the next module's
  weights while this one computes.

Example:
    >>> import torch
    >>> layer = torch.nn.Linear(2, 2)
    >>> from workbench.big_modeling.hooks.base import add_hook_to_module
    >>> _ = add_hook_to_module(layer, AlignDevicesHook("cpu", offload=True))
    >>> layer.weight.device
    device(type='meta')
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from workbench.big_modeling import transfers as _transfers
from workbench.big_modeling.devices import DeviceValue, to_torch_device
from workbench.big_modeling.errors import CheckpointError
from workbench.big_modeling.hooks.base import InputMove, ModelHook, iter_hooks
from workbench.big_modeling.hooks.events import report_onload
from workbench.big_modeling.hooks.io_moves import (
    _skip_set,
    find_device,
    move_args,
    move_kwargs,
    send_to_device,
    with_row_major_strides,
)
from workbench.big_modeling.hooks.tensor_slots import (
    TensorSlot,
    TiedParamsMap,
    named_module_tensors,
    non_persistent_buffers,
    place_tensor,
    set_slot,
    tie_key,
)


class AlignDevicesHook(ModelHook):
    """Puts inputs and weights on ``execution_device`` for the forward.

    Args:
        execution_device: where the forward runs (int, ``"cuda:0"``, ``"cpu"``, torch.device);
            None leaves inputs and weights where they are.
        offload: keep weights as ``meta`` placeholders between forwards, materialising them
            from ``weights_map`` for each forward.
        io_same_device: move outputs back to the device of the first input tensor.
        weights_map: a (possibly lazy) mapping of the module's tensor names to their values;
            built from the module's tensors (moved to CPU) when None and ``offload``.
        offload_buffers: offload buffers too (otherwise they live on the execution device).
        place_submodules: handle the submodules' tensors too (for ``preload_module_classes``).
        skip_keys: mapping keys of inputs/outputs never moved (e.g. ``"past_key_values"``).
        tied_params_map: tie key -> {device: tensor}, shared by all hooks of a model so a tied
            weight is materialised once per execution device.
        module_name: keyword-only; the module's dotted name, used in transfer events and errors.

    Raises:
        DeviceMapError: ``execution_device`` is ``"disk"`` or not a device.

    Example:
        >>> AlignDevicesHook("cpu", io_same_device=True)
        AlignDevicesHook(execution_device='cpu', io_same_device=True)
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Mapping[str, Tensor] | None = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: str | list[str] | None = None,
        tied_params_map: TiedParamsMap | None = None,
        *,
        module_name: str = "",
    ) -> None:
        self.execution_device = execution_device
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map = tied_params_map
        self.module_name = module_name
        self.prefetcher: Any = None
        self.input_device: torch.device | None = None
        self.original_devices: dict[str, torch.device] = {}
        self._slots: list[TensorSlot] = []
        self._tied_added: list[int] = []
        self._depth = 0
        self._input_devices: list[torch.device | None] = []

    # -- configuration -------------------------------------------------------------------------

    @property
    def execution_device(self) -> int | str | torch.device | None:
        return self._execution_device

    @execution_device.setter
    def execution_device(self, value: int | str | torch.device | None) -> None:
        self._execution_device = value
        self._device = None if value is None else to_torch_device(value)
        self._non_blocking = self._device is not None and self._device.type == "cuda"
        for slot in getattr(self, "_slots", ()):
            slot.cached_source = slot.cached_value = None  # zero-copy values are per device
        self._refresh_fast_path()

    @property
    def device(self) -> torch.device | None:
        """``execution_device`` as a ``torch.device`` (None: nothing is moved)."""
        return self._device

    def _refresh_fast_path(self) -> None:
        offload = getattr(self, "_offload", False)
        io_same_device = getattr(self, "_io_same_device", False)
        self._moves_only = not offload and not io_same_device
        cls = type(self)
        device = getattr(self, "_device", None)
        inline = (
            self._moves_only
            and device is not None
            and not self.no_grad
            and cls.pre_forward is AlignDevicesHook.pre_forward
            and cls.post_forward is AlignDevicesHook.post_forward
        )
        skip = getattr(self, "_skip", frozenset())
        self.input_move = InputMove(device, self._non_blocking, skip) if inline else None

    @property
    def offload(self) -> bool:
        return self._offload

    @offload.setter
    def offload(self, value: bool) -> None:
        self._offload = bool(value)
        self._refresh_fast_path()

    @property
    def io_same_device(self) -> bool:
        return self._io_same_device

    @io_same_device.setter
    def io_same_device(self, value: bool) -> None:
        self._io_same_device = bool(value)
        self._refresh_fast_path()

    @property
    def weights_map(self) -> Mapping[str, Tensor] | None:
        return self._weights_map

    @weights_map.setter
    def weights_map(self, value: Mapping[str, Tensor] | None) -> None:
        """Replacing the map (peft does after merging adapters) re-resolves every slot."""
        self._weights_map = value
        if value is not None:
            for slot in getattr(self, "_slots", ()):
                slot.resolve(value)
        prefetcher = getattr(self, "prefetcher", None)
        if prefetcher is not None:
            prefetcher.forget(self)  # what it fetched came from the old map

    @property
    def skip_keys(self) -> str | list[str] | None:
        return self._skip_keys

    @skip_keys.setter
    def skip_keys(self, value: str | list[str] | None) -> None:
        self._skip_keys = value
        self._skip = _skip_set(value)
        self._refresh_fast_path()

    @property
    def slots(self) -> list[TensorSlot]:
        """The offloaded tensors this hook swaps in and out (empty without ``offload``)."""
        return self._slots

    @property
    def offloaded_nbytes(self) -> int:
        return sum(slot.nbytes for slot in self._slots)

    def _repr_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"execution_device": self._execution_device}
        if self.module_name:
            fields["module"] = self.module_name
        if self.offload:
            fields["offload"] = f"{len(self._slots)} tensors, {self.offloaded_nbytes} B"
        for name in ("io_same_device", "offload_buffers", "place_submodules"):
            if getattr(self, name):
                fields[name] = True
        if self._skip_keys:
            fields["skip_keys"] = self._skip_keys
        return fields

    # -- attach / detach -----------------------------------------------------------------------

    def init_hook(self, module: nn.Module) -> nn.Module:
        device = self._device
        if device is not None and device.type == "meta":
            self.tied_params_map = None  # every meta tensor has data pointer 0
        if not self.offload:
            if device is not None:
                self._place_all(module, device)
            return module
        entries = named_module_tensors(
            module,
            include_buffers=self.offload_buffers,
            recurse=self.place_submodules,
            remove_non_persistent=True,
        )
        self.original_devices = {
            name: tensor.device
            for name, *_, tensor in named_module_tensors(module, recurse=self.place_submodules)
        }
        if self.weights_map is None:
            self._weights_from_module(entries)
        missing = sorted(name for name, *_ in entries if name not in self.weights_map)
        if missing:
            raise CheckpointError(
                f"weights_map of module {self.module_name or type(module).__name__!r} lacks "
                f"{len(missing)} tensors: {', '.join(missing)}. Offload them (offload_state_dict) "
                "or pass a state_dict that holds them."
            )
        tied = self.tied_params_map
        self._slots = []
        for name, owner, attr, is_param, tensor in entries:
            key = tie_key(tensor)
            slot = TensorSlot(
                name,
                owner,
                attr,
                is_param,
                tensor,
                tie=key if tied is not None and key in tied else None,
            )
            slot.resolve(self.weights_map)
            self._slots.append(slot)
            slot.offload()
        if device is not None:
            self._place_buffers(module, device)
        return module

    def _weights_from_module(self, entries: list) -> None:
        on_meta = sorted(name for name, *_, tensor in entries if tensor.device.type == "meta")
        if on_meta:
            raise CheckpointError(
                f"cannot offload module {self.module_name!r}: {len(on_meta)} tensors are on the "
                f"meta device with no weights_map: {', '.join(on_meta)}. Load their weights "
                "first or pass weights_map/state_dict."
            )
        self.weights_map = {name: tensor.to("cpu") for name, *_, tensor in entries}

    def _place_all(self, module: nn.Module, device: torch.device) -> None:
        entries = named_module_tensors(module, recurse=self.place_submodules)
        on_meta = sorted(n for n, *_, t in entries if t.device.type == "meta")
        if on_meta and device.type != "meta":
            where = self.module_name or type(module).__name__
            raise CheckpointError(
                f"module {where!r} has {len(on_meta)} tensors still on the meta device: "
                f"{', '.join(on_meta)}. Load the checkpoint first, or offload them."
            )
        for _, owner, attr, is_param, tensor in entries:
            place_tensor(owner, attr, is_param, tensor, device, self.tied_params_map)

    def _place_buffers(self, module: nn.Module, device: torch.device) -> None:
        """Buffers that stay on the execution device: persistent ones come from weights_map."""
        if self.offload_buffers:
            for _, owner, attr, tensor in non_persistent_buffers(module, self.place_submodules):
                place_tensor(owner, attr, False, tensor, device, None)
            return
        for name, owner, attr, is_param, tensor in named_module_tensors(
            module, recurse=self.place_submodules
        ):
            if is_param:
                continue
            persistent = attr not in owner._non_persistent_buffers_set
            if persistent and name in self.weights_map:
                stored = self.weights_map[name]
                value = stored.to(device=device, dtype=tensor.dtype)
                place_tensor(owner, attr, False, value, device, None)
            elif tensor.device.type == "meta" and device.type != "meta":
                raise CheckpointError(
                    f"buffer {name!r} of module {self.module_name!r} is on the meta device and "
                    "weights_map does not hold it; load the checkpoint or offload it."
                )
            else:
                place_tensor(owner, attr, False, tensor, device, None)

    def detach_hook(self, module: nn.Module) -> nn.Module:
        if self.offload:
            for slot in self._slots:
                device = self.original_devices.get(slot.name)
                if device is None or device.type == "meta":
                    continue
                value = self.weights_map[slot.name].to(device=device, dtype=slot.dtype)
                place_tensor(slot.owner, slot.attr, slot.is_param, value, device, None)
                if slot.is_param:
                    slot.owner._parameters[slot.attr].requires_grad_(slot.requires_grad)
            self._slots = []
        return module

    # -- forward -------------------------------------------------------------------------------

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        device = self._device
        if self._moves_only:  # inputs already on the device cost one check each
            if device is not None:
                args = move_args(args, device, self._non_blocking)
                if kwargs:
                    kwargs = move_kwargs(kwargs, device, self._non_blocking, self._skip)
            return args, kwargs
        if self._io_same_device:
            self.input_device = find_device((args, kwargs))
            self._input_devices.append(self.input_device)
        if self._offload:
            self._depth += 1
            if self._depth == 1:
                try:
                    self._onload()
                except BaseException:
                    self._release()
                    raise
        if self._offload:  # onloaded weights: matmul copies them for oddly strided inputs
            args = with_row_major_strides(args)
        if device is None:
            return args, kwargs
        try:
            args = move_args(args, device, self._non_blocking)
            if kwargs:
                kwargs = move_kwargs(kwargs, device, self._non_blocking, self._skip)
        except BaseException:
            self._release()
            raise
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        if self._moves_only:
            return output
        if self._offload:
            self._depth -= 1
            if self._depth == 0:
                self._put_back()
        if self._io_same_device:
            input_device = self._input_devices.pop() if self._input_devices else None
            if input_device is not None:
                output = send_to_device(output, input_device, skip_keys=self._skip)
        return output

    def forward_failed(self, module: nn.Module, error: BaseException) -> None:
        self._release()

    def _release(self) -> None:
        """Undo ``pre_forward`` after a failure: placeholders back, input device forgotten."""
        if self.offload:
            self._depth = max(0, self._depth - 1)
            if self._depth == 0:
                self._put_back()
        if self.io_same_device and self._input_devices:
            self._input_devices.pop()

    def _onload(self) -> None:
        recorder = _transfers._recorder
        start_s, start_event = 0.0, None
        if recorder is not None:
            start_s = time.perf_counter()
            if self._non_blocking:  # CUDA: time the copies on the GPU with events
                start_event = torch.cuda.Event(enable_timing=True)
                start_event.record(torch.cuda.current_stream(self._device))
        prefetched = self.prefetcher.take(self) if self.prefetcher is not None else None
        device, non_blocking = self._device, self._non_blocking
        tied = self.tied_params_map
        for slot in self._slots:
            if slot.tie is not None and tied is not None:
                per_device = tied.get(slot.tie)
                if per_device is not None and device in per_device:
                    set_slot(slot.owner, slot.attr, slot.is_param, per_device[device])
                    continue
            if prefetched is not None and slot.name in prefetched:
                stored = prefetched[slot.name]
            else:
                stored = slot.mapping[slot.key]
            value = slot.materialize(stored, device, non_blocking)
            if slot.is_param:
                slot.owner._parameters[slot.attr] = value
            else:
                slot.owner._buffers[slot.attr] = value
            if slot.tie is not None and tied is not None:
                tied.setdefault(slot.tie, {})[device] = value
                self._tied_added.append(slot.tie)
        if recorder is not None:
            report_onload(recorder, self, start_s, start_event)

    def _put_back(self) -> None:
        for slot in self._slots:
            slot.offload()
        if self._tied_added:
            tied = self.tied_params_map or {}
            for key in self._tied_added:
                tied.get(key, {}).pop(self._device, None)
            self._tied_added = []


def offloading_hook(module: nn.Module) -> AlignDevicesHook | None:
    """The offloading ``AlignDevicesHook`` attached to ``module`` (in a chain too), or None."""
    for hook in iter_hooks(module.__dict__.get("_hf_hook")):
        if isinstance(hook, AlignDevicesHook) and hook.offload:
            return hook
    return None


def has_offloaded_params(module: nn.Module) -> bool:
    """True when ``module`` has an offloading ``AlignDevicesHook`` attached.

    Example:
        >>> import torch
        >>> has_offloaded_params(torch.nn.Linear(2, 2))
        False
    """
    return offloading_hook(module) is not None


@contextmanager
def align_module_device(
    module: nn.Module, execution_device: DeviceValue | None = None
) -> Iterator[None]:
    """Within the block, ``module``'s direct parameters are on the execution device.

    For an offloaded module its hook materialises the weights (on ``execution_device`` when
    given, else the hook's); otherwise parameters are moved to ``execution_device`` and back.

    Args:
        module: the module.
        execution_device: where to put the parameters; None uses the hook's device.

    Example:
        >>> import torch
        >>> layer = torch.nn.Linear(2, 2)
        >>> with align_module_device(layer, "cpu"):
        ...     layer.weight.device
        device(type='cpu')
    """
    hook = offloading_hook(module)
    if hook is not None:
        original = hook.execution_device
        if execution_device is not None:
            hook.execution_device = execution_device
        try:
            hook.pre_forward(module)
            try:
                yield
            finally:
                hook.post_forward(module, None)
        finally:
            hook.execution_device = original
    elif execution_device is not None:
        device = to_torch_device(execution_device)
        originals = dict(module._parameters)
        try:
            for name, param in originals.items():
                if param is not None:
                    place_tensor(module, name, True, param, device, None)
            yield
        finally:
            module._parameters.update(originals)
    else:
        yield
