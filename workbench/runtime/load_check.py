"""The one check of "can this map load?", shared by the planner, the lanes and the loader.

The planner's status column, the lanes' "map valid" and Load & dispatch (before the worker
starts) all ask ``check_load``, so the window never calls a map "ok" or "valid" that the loader
refuses. It runs the engine's own checks: ``check_device_map`` (every tensor covered once, no
unknown keys or device values) and ``check_devices_available`` (the devices exist on this
machine). A map that fits a what-if profile but names devices this machine lacks is a valid
plan that cannot load *here*: ``map_problems`` is empty, ``device_problems`` says why. A model
opened from a config alone plans fine but has no weights to load (``weight_problems``); a GGUF
file has them (the load job converts it first, once: Tools > Convert for loading does that step
with its own progress).

An all-disk map is valid: the CPU executes disk-offloaded modules (as in the reference).

Example:
    >>> check = check_load(opened, {"": "cpu"})  # doctest: +SKIP
    >>> check.loadable, check.reason
    (True, '')
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workbench.big_modeling.device_map.coverage import resolve_device_map
from workbench.big_modeling.devices import check_devices_available
from workbench.big_modeling.errors import DeviceMapError


@dataclass(frozen=True)
class LoadCheck:
    """Why a device map cannot load (each tuple empty when that part is fine).

    Attributes:
        map_problems: the map is wrong for the model (uncovered tensors, unknown keys, values
            that are not devices, an empty map): no machine can load it.
        device_problems: devices the map names that this machine does not have.
        weight_problems: the model has no checkpoint (opened from a config.json alone).
    """

    map_problems: tuple[str, ...] = ()
    device_problems: tuple[str, ...] = ()
    weight_problems: tuple[str, ...] = ()

    @property
    def map_valid(self) -> bool:
        """True when the map places every tensor of the model on a device."""
        return not self.map_problems

    @property
    def loadable(self) -> bool:
        """True when Load & dispatch would start a load that the loader accepts."""
        return not (self.map_problems or self.device_problems or self.weight_problems)

    @property
    def problems(self) -> tuple[str, ...]:
        """Every problem, the map's first."""
        return (*self.map_problems, *self.device_problems, *self.weight_problems)

    @property
    def reason(self) -> str:
        """Why the map cannot load, in one text (``""`` when it can)."""
        return "\n".join(self.problems)


def check_map(model: Any, device_map: Mapping[str, object]) -> tuple[str, ...]:
    """Return the problems the loader would find with ``device_map`` for ``model`` (meta
    weights are fine): an empty map, or what ``check_device_map`` raises."""
    if not device_map:
        return ("the device map is empty; plan it or assign modules first",)
    if model is None:
        return ()
    global _last_map_check
    key = (id(model), tuple(device_map.items()))
    last_key, last_model, last_problems = _last_map_check  # one read: threads share it
    if last_key == key and last_model() is model:
        return last_problems  # a refresh without a map change (budgets, profile) is free
    problems: tuple[str, ...] = ()
    try:
        # the strict check (check_device_map only warns about unknown names, as the reference)
        resolve_device_map(model, dict(device_map))  # type: ignore[arg-type]
    except DeviceMapError as exc:
        problems = (str(exc),)
    _last_map_check = (key, weakref.ref(model), problems)
    return problems


# (model id, map items), a weak reference to the model (never keeps a replaced one alive), problems
_last_map_check: tuple[Any, Any, tuple[str, ...]] = (None, lambda: None, ())


def check_devices(device_map: Mapping[str, object]) -> tuple[str, ...]:
    """Return why this machine cannot hold ``device_map``'s devices (empty when it can)."""
    try:
        check_devices_available(dict(device_map))  # type: ignore[arg-type]
    except DeviceMapError as exc:
        return (str(exc),)
    return ()


def check_load(opened: Any, device_map: Mapping[str, object]) -> LoadCheck:
    """Check that ``device_map`` can load ``opened`` (an ``OpenedModel``) on this machine.

    Args:
        opened: the opened model (``None``: nothing to load).
        device_map: ``{module or tensor prefix: device}``.

    Returns:
        A ``LoadCheck``; ``loadable`` is what the loader would say before reading a byte.
    """
    if opened is None:
        return LoadCheck(map_problems=("open a model first (File > Open)",))
    map_problems = check_map(getattr(opened, "model", None), device_map)
    device_problems = check_devices(device_map) if not map_problems else ()
    weight_problems: tuple[str, ...] = ()
    if getattr(opened, "checkpoint", None) is None and getattr(opened, "gguf", None) is None:
        weight_problems = (
            f"{getattr(opened, 'source', 'this model')} has no weights (opened from a config "
            "alone): it can be planned, not loaded; open a model folder with safetensors",
        )
    return LoadCheck(map_problems, device_problems, weight_problems)
