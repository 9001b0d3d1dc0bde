"""Bytes a module needs beside its weights on the device it is placed on (its layer's KV cache).

The planner adds a module's charge to its size and to the size of every module above it, so
the greedy pass places the charge with the module (a decoder layer brings its cache to the
device it goes to); afterwards ``charged_by_device`` says how much of each device's total was
charges, so the reported weights stay weights. A charged module that the pass splits into
its parts loses its charge (the parts are sized without it); the planner's reserve check
counts what ``charged_by_device`` finds and nothing else, so such a charge is then reserved
through ``reserve_for_map`` instead.

Example:
    >>> charged_by_device([("model.layers.0", 0), ("model.layers.1", "cpu")],
    ...                   {"model.layers.0": 10, "model.layers.1": 20})
    {0: 10, 'cpu': 20}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from workbench.big_modeling.devices import Device
from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.planning.module_index import ModuleIndex

__all__ = ["apply_charges", "charge_within", "charged_by_device"]


def apply_charges(index: ModuleIndex, charges: Mapping[str, int]) -> None:
    """Add each ``charges[name]`` to the size of module ``name`` and of its ancestors.

    Raises:
        BadInputError: for a charged name that is no module of the model, or a negative charge.
    """
    positions = {index.name_of(position): position for position in range(len(index.sizes))}
    unknown = sorted(name for name in charges if name not in positions)
    if unknown:
        raise BadInputError(
            f"layer charges name {len(unknown)} modules the model lacks: {', '.join(unknown)}"
        )
    for name, nbytes in charges.items():
        if nbytes < 0:
            raise BadInputError(f"layer charge of {name} is negative ({nbytes} B)")
        position = positions[name]
        while position >= 0:  # the root's parent is -1
            index.sizes[position] += int(nbytes)
            position = index.parents[position]


def charge_within(name: str, charges: Mapping[str, int]) -> int:
    """Bytes of charges on module ``name`` or inside it (``""``: the whole model)."""
    return sum(
        nbytes
        for charged, nbytes in charges.items()
        if not name or charged == name or charged.startswith(f"{name}.")
    )


def charged_by_device(
    assignments: Iterable[tuple[str, Device]], charges: Mapping[str, int]
) -> dict[Device, int]:
    """Bytes of charges each device received with the modules assigned to it.

    A charge goes with the assignment of its module or of the closest module above it; a
    charge whose module was split (only its parts assigned) is on no device.
    """
    assigned = dict(assignments)
    result: dict[Device, int] = {}
    for name, nbytes in charges.items():
        prefix = name
        while True:
            if prefix in assigned:
                device = assigned[prefix]
                result[device] = result.get(device, 0) + int(nbytes)
                break
            if not prefix:
                break
            prefix = prefix.rpartition(".")[0]
    return result
