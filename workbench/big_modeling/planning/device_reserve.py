"""Memory to reserve on each device for the layers placed there: KV cache plus activation peak.

A KV cache lives where its layer runs, so the reserve is per device: the sum of the caches of
the layers on it, plus the activation peak of a forward through them (the logits on the device
that runs the last layer). ``reserve_per_device`` returns those bytes and one sentence per
device, in the words the planner's "why" uses::

    layers 0-31 on cuda:0 need 2.0 GiB of KV cache at 8192 context, fp16, GQA 8 of 32 heads

Example:
    >>> from transformers import LlamaConfig
    >>> config = LlamaConfig(num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
    ...                      num_key_value_heads=2, vocab_size=100)
    >>> reserve = reserve_per_device(config, ["cuda:0", "cuda:0", "cuda:1", "cuda:1"],
    ...                              batch=1, context=8192, kv_dtype="fp16")
    >>> reserve["cuda:1"].kv_nbytes, reserve["cuda:1"].why.split(" need")[0]
    (2097152, 'layers 2-3 on cuda:1')
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from workbench.big_modeling.devices import Device, normalize_device
from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.planning.activation_peak import (
    AttentionImplementation,
    forward_peak_terms,
)
from workbench.big_modeling.planning.attention_kinds import AttentionLayout
from workbench.big_modeling.planning.dtype_sizes import as_dtype, element_nbytes
from workbench.big_modeling.planning.kv_cache import (
    Engine,
    LayerKV,
    default_context,
    describe_dtype,
    kv_cache_per_layer,
    layout_of,
)
from workbench.big_modeling.planning.sizes import format_nbytes

__all__ = [
    "DeviceReserve",
    "layer_devices_from_map",
    "layer_module_names",
    "main_execution_device",
    "reserve_for_device_map",
    "reserve_per_device",
]

# ``model.layers.3``, ``transformer.h.3``, ``decoder.block.3``, ``backbone.layers.3``...
_LAYER_KEY = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)(?:\.|$)")
_OFFLOAD = ("cpu", "disk", "meta")
# Modules beside the layer stack: a map without layer keys places the layers with the others.
_NOT_LAYERS = {
    "embed_tokens",
    "wte",
    "wpe",
    "lm_head",
    "norm",
    "ln_f",
    "final_layernorm",
    "shared",
    "embed_positions",
    "embeddings",
    "rotary_emb",
}


@dataclass(frozen=True)
class DeviceReserve:
    """What one device must keep free for the layers placed on it.

    Attributes:
        device: the device, as the map names it (``"cuda:0"``, ``"cpu"``...).
        layers: indices of the decoder layers whose cache lives there.
        kv_nbytes: bytes of their caches.
        activation_nbytes: the activation peak of a prefill through them.
        why: one sentence, e.g. ``"layers 0-31 on cuda:0 need 2 GiB of KV cache at 8192
            context, fp16, GQA 8 of 32 heads; activation peak 256 MiB (MLP intermediate)"``. The
            logits are charged to the device of the last decoder layer.
        dequantize_nbytes: the dense copy of the largest nf4/fp4/int8 weight the device runs, per
            compute dtype (a precision map's; ``runtime.planning`` adds it).
    """

    device: str
    layers: tuple[int, ...]
    kv_nbytes: int
    activation_nbytes: int
    why: str
    dequantize_nbytes: int = 0

    @property
    def nbytes(self) -> int:
        """The reserve to pass to the planner for this device."""
        return self.kv_nbytes + self.activation_nbytes + self.dequantize_nbytes


def _device_name(device: object) -> str:
    if isinstance(device, bool):
        raise BadInputError(f"device {device!r} is not a device")
    if isinstance(device, int):
        return f"cuda:{device}"
    return str(device)


def layer_devices_from_map(device_map: Mapping[str, object], layer_count: int) -> list[str]:
    """The device each decoder layer runs on, read from a device map's module names.

    A key naming a layer (``model.layers.3``, ``transformer.h.3``, ``decoder.block.3``) or a
    module inside it places that layer; layers no key names go to the device of the shortest
    key that covers the whole stack (``""``, ``"model"``...). In an encoder-decoder map only
    ``decoder`` keys count.

    Raises:
        BadInputError: when some layer is on no device the map names.

    Example:
        >>> layer_devices_from_map({"model.embed": 0, "model.layers.0": 0, "model.layers.1": 1}, 2)
        ['cuda:0', 'cuda:1']
    """
    keys = list(device_map)
    if any(".decoder." in f".{key}." or key.startswith("decoder") for key in keys):
        keys = [key for key in keys if "decoder" in key or not _LAYER_KEY.search(key)]
    placed: dict[int, str] = {}
    for key in keys:
        match = _LAYER_KEY.search(key)
        if match is not None:
            placed.setdefault(int(match.group(1)), _device_name(device_map[key]))
    layer_keys = [key for key in keys if _LAYER_KEY.search(key)]
    others = [key for key in keys if not _LAYER_KEY.search(key)]
    covering = [
        key for key in others if key == "" or any(k.startswith(f"{key}.") for k in layer_keys)
    ]
    if not layer_keys:
        covering = [key for key in others if key.rsplit(".", 1)[-1] not in _NOT_LAYERS]
    fallback = _device_name(device_map[min(covering, key=len)]) if covering else None
    devices = []
    for index in range(layer_count):
        device = placed.get(index, fallback)
        if device is None:
            raise BadInputError(f"the device map places no device for decoder layer {index}")
        devices.append(device)
    return devices


_LAYER_MODULE = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)$")


def layer_module_names(module_names: Iterable[str], layer_count: int) -> dict[int, str]:
    """The module of each decoder layer, by the names ``layer_devices_from_map`` reads.

    ``model.layers.3``, ``transformer.h.3``, ``decoder.block.3``: the shortest module name
    ending in a layer list and the layer's index (only ``decoder`` ones in an
    encoder-decoder model). Layers no name matches are left out.

    Example:
        >>> layer_module_names(["", "model", "model.layers", "model.layers.0",
        ...                     "model.layers.0.mlp", "model.layers.1", "lm_head"], 2)
        {0: 'model.layers.0', 1: 'model.layers.1'}
    """
    names = [name for name in module_names if _LAYER_MODULE.search(name)]
    if any(".decoder." in f".{name}." or name.startswith("decoder") for name in names):
        names = [name for name in names if "decoder" in name]
    found: dict[int, str] = {}
    for name in sorted(names, key=len):
        match = _LAYER_MODULE.search(name)
        index = int(match.group(1)) if match else -1
        if 0 <= index < layer_count:
            found.setdefault(index, name)
    return dict(sorted(found.items()))


def _ranges(indices: Sequence[int]) -> str:
    parts: list[str] = []
    start = previous = indices[0]
    for index in [*indices[1:], None]:
        if index is not None and index == previous + 1:
            previous = index
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if index is not None:
            start = previous = index
    label = "layer" if len(indices) == 1 else "layers"
    return f"{label} {', '.join(parts)}"


def _context_words(context: int) -> str:
    return f"{context // 1024}k" if context % 1024 == 0 and context >= 1024 else str(context)


def reserve_per_device(
    config: Any,
    device_map_or_layer_devices: Mapping[str, object] | Sequence[object],
    *,
    batch: int = 1,
    context: int | None = None,
    kv_dtype: torch.dtype | str | None = None,
    model_dtype: torch.dtype | str = torch.float16,
    engine: Engine = "transformers",
    attention: AttentionImplementation = "sdpa",
    logits_to_keep: int = 1,
    context_cap: int = 32768,
    offload_execution_device: object | None = None,
    prompt_tokens: int | None = None,
) -> dict[str, DeviceReserve]:
    """Bytes each device must keep free: its layers' KV cache plus their activation peak.

    Per device ``d``: ``kv(d) = sum of kv_cache_per_layer(...)[i].nbytes for layers i on d``
    (static figures, the most a cache holds) and ``activation(d) = residual + mask +
    max(attention, mlp)`` of a prefill of ``prompt_tokens`` through those layers, plus the
    logits on the device of the last layer (``activation_peak`` gives the terms). A chunked
    prefill (``prompt_tokens < context``) counts the larger of its first chunk and its last,
    which attends to ``context - prompt_tokens`` cached tokens besides its own.

    Args:
        config: a transformers config (or an ``AttentionLayout``).
        device_map_or_layer_devices: a device map (module name -> device) or one device per
            decoder layer.
        batch: sequences.
        context: tokens the cache holds; ``None``: ``default_context(config, context_cap)``.
        kv_dtype: dtype of the K/V tensors; ``None``: ``model_dtype``.
        model_dtype: the compute dtype.
        engine: whose cache layout (MLA latent or expanded; see ``kv_cache``).
        attention: the model's attention implementation.
        logits_to_keep: positions whose logits are computed (``generate``: 1).
        context_cap: the cap on ``max_position_embeddings`` when ``context`` is ``None``.
        offload_execution_device: where layers mapped to ``"cpu"`` / ``"disk"`` run when they
            are offloaded (their cache lives there); ``None`` keeps them on ``"cpu"``.
        prompt_tokens: tokens of the prefill; ``None``: ``context``.

    Returns:
        ``{device: DeviceReserve}`` for every device that runs at least one decoder layer.

    Raises:
        BadInputError: for a per-layer list of the wrong length, a map that leaves a layer on
            no device, or the errors of ``kv_cache_per_layer``.
    """
    layout: AttentionLayout = layout_of(config)
    count = len(layout.layers)
    if isinstance(device_map_or_layer_devices, Mapping):
        devices = layer_devices_from_map(device_map_or_layer_devices, count)
    else:
        devices = [_device_name(device) for device in device_map_or_layer_devices]
        if len(devices) != count:
            raise BadInputError(f"got {len(devices)} layer devices for {count} decoder layers")
    if offload_execution_device is not None:
        runner = _device_name(offload_execution_device)
        devices = [runner if device in _OFFLOAD else device for device in devices]
    context = context if context is not None else default_context(layout, context_cap)
    kv = kv_cache_per_layer(
        layout,
        batch=batch,
        context=context,
        kv_dtype=kv_dtype,
        model_dtype=model_dtype,
        engine=engine,
    )
    words_dtype = describe_dtype(
        as_dtype(kv_dtype) if kv_dtype is not None else as_dtype(model_dtype)
    )
    nbytes = element_nbytes(as_dtype(model_dtype))
    result: dict[str, DeviceReserve] = {}
    for device in dict.fromkeys(devices):
        indices = [i for i, d in enumerate(devices) if d == device]
        sub = replace(layout, layers=tuple(layout.layers[i] for i in indices))
        carries_logits = devices[-1] == device
        activation, largest = 0, "attention"
        for past in _chunk_pasts(context, prompt_tokens):
            terms = forward_peak_terms(
                sub,
                batch=batch,
                tokens=min(prompt_tokens or context, context),
                past=past,
                nbytes=nbytes,
                attention=attention,
                logits_to_keep=logits_to_keep,
            )
            candidates = {"attention": terms["attention"], "MLP intermediate": terms["mlp"]}
            if carries_logits:
                candidates["logits"] = terms["logits"]
            chunk_largest = max(candidates, key=lambda name: candidates[name])
            chunk_peak = terms["residual"] + terms["mask"] + candidates[chunk_largest]
            if chunk_peak > activation:
                activation, largest = chunk_peak, chunk_largest
        kv_bytes = sum(kv[i].nbytes for i in indices)
        if layout.encoder_only:
            cache_words = (
                f"{_ranges(indices)} on {device} keep no KV cache (an encoder, one forward "
                f"over {_context_words(context)} tokens)"
            )
        else:
            cache_words = (
                f"{_ranges(indices)} on {device} need {format_nbytes(kv_bytes)} of KV cache at "
                f"{_context_words(context)} context, {words_dtype}, "
                f"{_kinds([kv[i] for i in indices])}"
            )
        why = f"{cache_words}; activation peak {format_nbytes(activation)} ({largest})"
        result[device] = DeviceReserve(device, tuple(indices), kv_bytes, activation, why)
    return result


def _chunk_pasts(context: int, prompt_tokens: int | None) -> tuple[int, ...]:
    """Tokens cached before the prefill chunks whose peaks bound the prefill: the first chunk
    (nothing cached: a sliding layer's whole-chunk storage, the encoder's output) and, when the
    prefill is chunked, the last one, which attends to the whole context."""
    if prompt_tokens is None or prompt_tokens >= context:
        return (0,)
    return (0, context - prompt_tokens)


def _kinds(layers: Sequence[LayerKV]) -> str:
    """The distinct layer labels, with counts when they differ: ``"GQA 8 of 32 heads"``."""
    counts: dict[str, int] = {}
    for layer in layers:
        counts[layer.attention.label] = counts.get(layer.attention.label, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{n} x {label}" for label, n in counts.items())


def main_execution_device(device_map: Mapping[str, object]) -> Device:
    """Where ``dispatch_model`` runs the ``"cpu"`` / ``"disk"`` blocks of ``device_map``.

    The first device of the map that is neither ``"cpu"`` nor ``"disk"`` (its weights come
    there for each forward, so the cache of an offloaded layer lives there too); ``"cpu"``
    when the map names only those (the CPU then runs the disk blocks).

    Example:
        >>> main_execution_device({"embed": "cpu", "layers.0": 1, "layers.1": 0})
        1
    """
    devices = [normalize_device(device) for device in device_map.values()]  # type: ignore[arg-type]
    accelerators = [device for device in devices if device not in ("cpu", "disk", "meta")]
    return accelerators[0] if accelerators else "cpu"


def reserve_for_device_map(
    config: Any, device_map: Mapping[str, object], **options: Any
) -> dict[Device, DeviceReserve]:
    """``reserve_per_device`` for a device map as dispatch executes it, keyed like the map.

    Layers mapped to ``"cpu"`` or ``"disk"`` run on ``main_execution_device(device_map)``
    (dispatch brings their weights there), so their KV cache and activations are charged to
    it, not to the CPU or the disk. Keys are device-map values (``0``, ``"cpu"``), the
    planner's budgets' spelling.

    Args:
        config: a transformers config or an ``AttentionLayout``.
        device_map: module name -> device.
        options: ``batch``, ``context``, ``kv_dtype``, ``model_dtype``, ``engine``,
            ``attention``, ``context_cap``, ``prompt_tokens`` of ``reserve_per_device``.

    Returns:
        ``{device: DeviceReserve}`` for each device that runs decoder layers.

    Raises:
        BadInputError: as ``reserve_per_device``.

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
        ...                      num_key_value_heads=2, vocab_size=100)
        >>> reserve = reserve_for_device_map(
        ...     config, {"model.layers.0": 0, "model.layers.1": "cpu"}, context=8, kv_dtype="fp16")
        >>> list(reserve), reserve[0].layers  # layer 1 is offloaded: it runs on GPU 0
        ([0], (0, 1))
    """
    runner = main_execution_device(device_map)
    reserves = reserve_per_device(config, device_map, offload_execution_device=runner, **options)
    layout = layout_of(config)
    mapped = layer_devices_from_map(device_map, len(layout.layers))
    runner_name = _device_name(runner)
    offloaded = [i for i, d in enumerate(mapped) if d in _OFFLOAD and d != runner_name]
    result = {normalize_device(name): reserve for name, reserve in reserves.items()}
    if offloaded and runner in result:
        kinds = "/".join(sorted({mapped[i] for i in offloaded}))
        note = f" ({_ranges(offloaded)} offloaded to {kinds}, run here)"
        reserve = result[runner]
        why = reserve.why.replace(" need ", note + " need ", 1)
        result[runner] = replace(reserve, why=why)
    return result
