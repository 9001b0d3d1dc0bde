"""``DeviceMap``: a device map normalised once, with the one "longest covering key" lookup.

A device map sends dotted module (or tensor) names to devices; a key covers itself and every
name below it (``"layers"`` covers ``"layers.0.mlp"``, ``""`` covers everything), and the
longest covering key wins, as in transformers (``{"": "cpu", "layers.0": 0}`` puts
``layers.0.mlp`` on GPU 0). ``covering_key`` is that rule, the only implementation of it in the
project; ``DeviceMap.device_for`` and ``device_for`` apply it to a map.

Example:
    >>> device_map = DeviceMap({"": "cpu", "layers.0": "cuda:0"})
    >>> device_map.device_for("layers.0.mlp"), device_map.device_for("lm_head")
    (0, 'cpu')
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping
from typing import Any, TypeVar

from workbench.big_modeling.devices import Device, DeviceValue, normalize_device
from workbench.big_modeling.errors import DeviceMapError

__all__ = [
    "DeviceMap",
    "clean_device_map",
    "covering_key",
    "device_for",
    "normalize_device_map",
    "refuse_non_string_keys",
]

_Value = TypeVar("_Value")


def covering_key(name: str, keys: Container[str]) -> str | None:
    """The longest of ``keys`` that is ``name`` or a dotted prefix of it; ``None`` if none is.

    ``""`` is the prefix of every name. Costs one membership test per dot of ``name``.

    Example:
        >>> covering_key("layers.0.mlp", {"", "layers"}), covering_key("head", {"layers"})
        ('layers', None)
    """
    key = name
    while key not in keys:
        if not key:
            return None
        key = key.rpartition(".")[0]
    return key


def device_for(name: str, device_map: Mapping[str, _Value]) -> _Value | None:
    """The value of the longest key of ``device_map`` covering ``name`` (``None``: no key does).

    Example:
        >>> device_for("layers.0.mlp", {"": "cpu", "layers.0": 0})
        0
    """
    key = covering_key(name, device_map)
    return None if key is None else device_map[key]


def normalize_device_map(device_map: Mapping[str, DeviceValue]) -> dict[str, Device]:
    """``device_map`` with every device canonical (``"cuda:1"`` -> ``1``), as a new dict.

    A ``DeviceMap`` is returned as a plain dict without being checked again.

    Raises:
        DeviceMapError: when ``device_map`` is not a mapping, has keys that are not strings, or
            values that are not devices (every offender listed, sorted).

    Example:
        >>> normalize_device_map({"": "CPU", "lm_head": "cuda:1"})
        {'': 'cpu', 'lm_head': 1}
    """
    if isinstance(device_map, DeviceMap):
        return device_map.to_dict()
    if not isinstance(device_map, Mapping):
        raise DeviceMapError(
            f"device_map must be a dict of module name -> device, got {type(device_map).__name__}"
        )
    refuse_non_string_keys(device_map)
    devices: dict[str, Device] = {}
    bad: list[tuple[str, str]] = []
    for key, value in device_map.items():
        try:
            devices[key] = normalize_device(value)
        except DeviceMapError as error:
            bad.append((f"{key!r}: {value!r}", str(error)))
    if bad:
        bad.sort()
        listed = ", ".join(entry for entry, _ in bad[:20])
        more = f" and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise DeviceMapError(
            f"device_map has {len(bad)} values that are not devices: {listed}{more} ({bad[0][1]})"
        )
    return devices


class DeviceMap(Mapping[str, Device]):
    """An immutable device map, normalised once at construction.

    Keys are module (or tensor) names as given; values are canonical devices (``Device``). It
    reads as a ``Mapping`` and compares equal to a plain dict with the same entries. The
    reference API functions (``check_device_map``, ``save_device_map``...) take plain dicts or
    a ``DeviceMap``.

    Raises:
        DeviceMapError: as ``normalize_device_map``.

    Example:
        >>> device_map = DeviceMap({"": "cpu", "lm_head": "cuda:1"})
        >>> device_map == {"": "cpu", "lm_head": 1}, device_map.covering_key("lm_head.weight")
        (True, 'lm_head')
    """

    __slots__ = ("_devices",)
    _devices: dict[str, Device]

    def __init__(self, device_map: Mapping[str, DeviceValue] | None = None) -> None:
        object.__setattr__(self, "_devices", normalize_device_map(device_map or {}))

    @classmethod
    def of(cls, device_map: Mapping[str, DeviceValue]) -> DeviceMap:
        """``device_map`` itself when it is a ``DeviceMap`` already, else a new one."""
        return device_map if isinstance(device_map, DeviceMap) else cls(device_map)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a DeviceMap is immutable; build a new one from an edited dict")

    def __getitem__(self, key: str) -> Device:
        return self._devices[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._devices)

    def __len__(self) -> int:
        return len(self._devices)

    def __contains__(self, key: object) -> bool:
        return key in self._devices

    def __hash__(self) -> int:
        return hash(frozenset(self._devices.items()))

    def __repr__(self) -> str:
        return f"DeviceMap({self._devices!r})"

    def __reduce__(self) -> tuple[type[DeviceMap], tuple[dict[str, Device]]]:
        return (DeviceMap, (self._devices,))

    def covering_key(self, name: str) -> str | None:
        """The longest key covering ``name`` (see ``covering_key``); ``None`` if none does."""
        return covering_key(name, self._devices)

    def device_for(self, name: str) -> Device | None:
        """The device of the longest key covering ``name``; ``None`` if no key covers it."""
        key = covering_key(name, self._devices)
        return None if key is None else self._devices[key]

    def devices(self) -> set[Device]:
        """The distinct devices the map names."""
        return set(self._devices.values())

    def to_dict(self) -> dict[str, Device]:
        """A new plain ``{name: device}`` dict, in the map's order (the JSON file's form)."""
        return dict(self._devices)


def clean_device_map(
    device_map: dict[str, DeviceValue], module_name: str = ""
) -> dict[str, DeviceValue]:
    """Merge keys under one module that share a device into that module's key.

    ``{"a.0": 0, "a.1": 0, "b": "cpu"}`` becomes ``{"a": 0, "b": "cpu"}``, and a map with one
    device throughout becomes ``{"": device}`` (only under ``module_name`` when given). Updates
    ``device_map`` in place and returns it. Linear in the number of keys.

    Example:
        >>> clean_device_map({"a.0": 0, "a.1": 0, "b": "cpu"})
        {'a': 0, 'b': 'cpu'}
    """
    prefix = f"{module_name}." if module_name else ""
    inside = [
        key for key in device_map if not module_name or key == module_name or key.startswith(prefix)
    ]
    if not inside:
        return device_map
    # A trie of the keys under module_name: node = [children dict, own device or _NONE].
    root: list[Any] = [{}, _NONE]
    for key in inside:
        node = root
        rest = key[len(prefix) :] if key != module_name else ""
        for part in rest.split(".") if rest else ():
            node = node[0].setdefault(part, [{}, _NONE])
        node[1] = device_map[key]
    merged: dict[str, DeviceValue] = {}
    _emit(root, module_name, merged)
    inside_keys = set(inside)
    result: dict[str, DeviceValue] = {}
    for key, device in device_map.items():
        if key not in inside_keys:
            result[key] = device
        elif merged:  # the merged keys take the place of the first key they replace
            result.update(merged)
            merged = {}
    device_map.clear()
    device_map.update(result)
    return device_map


class _NoDevice:
    def __repr__(self) -> str:
        return "<no device>"


_NONE = _NoDevice()


def _devices_below(node: list[Any], memo: dict[int, tuple[set[Any], int]]) -> tuple[set[Any], int]:
    """Distinct devices (capped at 2) and key count in ``node``'s subtree, iteratively."""
    order, stack = [], [node]
    while stack:
        current = stack.pop()
        order.append(current)
        stack.extend(current[0].values())
    for current in reversed(order):
        devices: set[Any] = set()
        count = 0
        if current[1] is not _NONE:
            devices.add(current[1])
            count = 1
        for child in current[0].values():
            child_devices, child_count = memo[id(child)]
            count += child_count
            if len(devices) < 2:
                devices |= child_devices
        memo[id(current)] = (devices, count)
    return memo[id(node)]


def _emit(root: list[Any], root_name: str, out: dict[str, DeviceValue]) -> None:
    memo: dict[int, tuple[set[Any], int]] = {}
    _devices_below(root, memo)
    stack: list[tuple[list[Any], str]] = [(root, root_name)]
    while stack:
        node, name = stack.pop()
        devices, count = memo[id(node)]
        if len(devices) == 1 and count > 1:
            out[name] = next(iter(devices))
            continue
        if node[1] is not _NONE:
            out[name] = node[1]
        prefix = f"{name}." if name else ""
        stack.extend((child, prefix + part) for part, child in reversed(node[0].items()))


def refuse_non_string_keys(device_map: Mapping[Any, object]) -> None:
    """Raise ``DeviceMapError`` naming every key of ``device_map`` that is not a string.

    Example:
        >>> refuse_non_string_keys({0: "cpu"})
        Traceback (most recent call last):
        ...
        workbench.big_modeling.errors.DeviceMapError: device_map has 1 keys that are not module names: 0 (int). Keys are dotted module names as strings ('model.layers.0', or '' for the whole model).
    """
    not_names = [key for key in device_map if not isinstance(key, str)]
    if not_names:
        shown = ", ".join(sorted(f"{key!r} ({type(key).__name__})" for key in not_names)[:20])
        raise DeviceMapError(
            f"device_map has {len(not_names)} keys that are not module names: {shown}. Keys are "
            "dotted module names as strings ('model.layers.0', or '' for the whole model)."
        )
