"""Device-map arithmetic the views need, over a ``ModuleTree``; pure Python, no Qt, no tensors.

A device map is ``{name: device}`` where ``name`` is a module or tensor prefix (``""`` covers
everything). ``MapIndex`` answers the questions the tree and the lanes ask many times per
repaint (which device shows for this row? how many bytes per device? what is uncovered?) in
O(depth) per row, after one O(entries x depth) pass per map change. ``move_modules`` computes
the map after a drag: moving a parent moves its subtree, an entry above a moved module is split
into its siblings, a no-split module is never split, and tied partners move together.
``diff_maps`` says what moved between two maps and ``key_problems`` what a map gets wrong.

Example:
    >>> index = MapIndex(tree, {"": "cpu"})  # doctest: +SKIP
    >>> index.device_of(tree.node("model.layers.0"))
    'cpu'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from workbench.models.tree import ModuleNode, ModuleTree
from workbench.runtime.basics import DeviceMapError
from workbench.runtime.engine import (
    DeviceDict,
    device_label,
    device_sort_key,
    normalize_device,
)

MIXED = "mixed"  # what device_of returns for a module whose subtree spans several entries


class MoveRefused(DeviceMapError):
    """A move the map rules forbid, e.g. splitting a no-split module; the message says why."""


@dataclass(frozen=True)
class MoveResult:
    """The map after a move, and what moved.

    Attributes:
        device_map: the new map.
        moved: the module names the user asked for (descendants of other picks dropped).
        tied_partners: modules added because they share a tied tensor with a moved one.
        device: the canonical target device.
    """

    device_map: DeviceDict
    moved: tuple[str, ...]
    tied_partners: tuple[str, ...] = field(default=())
    device: int | str = "cpu"

    def describe(self) -> str:
        """Return undo text such as ``"Move 3 modules to cuda:0 (+1 tied)"``."""
        count = len(self.moved)
        what = f"'{self.moved[0] or '(model)'}'" if count == 1 else f"{count} modules"
        text = f"Move {what} to {device_label(self.device)}"
        if self.tied_partners:
            text += f" (with tied {', '.join(self.tied_partners)})"
        return text


def _ancestors(name: str) -> Iterable[str]:
    """Yield the proper prefixes of a dotted name, nearest first, ending with ``""``."""
    while name:
        name = name.rpartition(".")[0]
        yield name


class MapIndex:
    """Answers per-row and per-device questions about one device map over one tree.

    Args:
        tree: the module tree.
        device_map: the map; values are normalised here (bad values raise ``DeviceMapError``).
    """

    def __init__(self, tree: ModuleTree, device_map: Mapping[str, object]) -> None:
        self.tree = tree
        self.device_map: DeviceDict = {
            name: normalize_device(device)  # type: ignore[arg-type]
            for name, device in device_map.items()
        }
        self._split: set[str] = set()
        for name in self.device_map:
            for ancestor in _ancestors(name):
                if ancestor in self._split:
                    break
                self._split.add(ancestor)

    def device_of(self, node: ModuleNode) -> int | str | None:
        """Return the device of ``node``: its own or nearest ancestor's entry, ``MIXED`` when
        entries below split it, ``None`` when nothing covers it."""
        if node.name in self._split:
            return MIXED
        current: ModuleNode | None = node
        while current is not None:
            device = self.device_map.get(current.name)
            if device is not None:
                return device
            current = current.parent
        return None

    def entry_nbytes(self, name: str) -> int:
        """Planning bytes covered by one map entry (a module or a tensor name)."""
        node = self.tree.get(name)
        if node is not None:
            return node.nbytes
        return self.tree.tensor_nbytes.get(name, 0)

    def per_device_bytes(self) -> dict[int | str, int]:
        """Planning bytes per device (devices in planner order)."""
        totals: dict[int | str, int] = {}
        for name, device in self.device_map.items():
            totals[device] = totals.get(device, 0) + self.entry_nbytes(name)
        return dict(sorted(totals.items(), key=lambda item: device_sort_key(item[0])))

    def entries_on(self, device: int | str) -> list[str]:
        """Return the map keys placed on ``device``, in module order."""
        names = [name for name, value in self.device_map.items() if value == device]
        return sorted(names, key=self.order_key)

    def order_key(self, name: str) -> tuple[int, ...]:
        """Sort key putting names in model order (rows along the path)."""
        node = self.tree.get(name)
        suffix: tuple[int, ...] = ()
        if node is None:  # a tensor key: after its owner's children
            owner = self.tree.get(self.tree.tensor_owner.get(name, ""))
            if owner is None:
                return (1 << 30,)
            node = owner
            suffix = (1 << 29,)
        rows: list[int] = []
        while node is not None and node.parent is not None:
            rows.append(node.row)
            node = node.parent
        return (*reversed(rows), *suffix)

    def uncovered(self, limit: int = 1000) -> list[str]:
        """Return up to ``limit`` names of modules or tensors that no entry covers, in order."""
        if "" in self.device_map:
            return []
        found: list[str] = []
        stack = [self.tree.root]
        while stack and len(found) < limit:
            node = stack.pop()
            if node.name in self.device_map:
                continue
            if node.name not in self._split:
                if node.nbytes > 0 or node.tensor_names:
                    found.append(node.name)
                continue
            found.extend(t for t in node.tensor_names if not self._tensor_covered(t))
            stack.extend(reversed(node.children))
        return found[:limit]

    def _tensor_covered(self, tensor_name: str) -> bool:
        return tensor_name in self.device_map

    def unknown_names(self) -> list[str]:
        """Map keys that are neither a module nor a tensor of the tree, sorted."""
        tensors = self.tree.tensor_owner
        return sorted(n for n in self.device_map if n not in self.tree and n not in tensors)


def move_modules(
    tree: ModuleTree,
    device_map: Mapping[str, object],
    names: Iterable[str],
    device: object,
) -> MoveResult:
    """Return the map with ``names`` (and their subtrees) moved to ``device``.

    Args:
        tree: the module tree.
        device_map: the current map (not modified).
        names: module names to move; a name under another picked name is ignored.
        device: the target device value.

    Returns:
        A ``MoveResult`` with the new map and undo text.

    Raises:
        MoveRefused: when a name is unknown or lies inside a no-split module (the message names
            the module and what to move instead).

    Example:
        >>> move_modules(tree, {"": "cpu"}, ["model.layers.0"], 0).describe()  # doctest: +SKIP
        "Move 'model.layers.0' to cuda:0"
    """
    target = normalize_device(device)  # type: ignore[arg-type]
    picked = _outermost(tree, names)
    if not picked:
        raise MoveRefused("nothing to move: select one or more modules first")
    partners = _tied_partners(tree, picked)
    to_move = _outermost(tree, [*picked, *partners])
    _refuse_no_split(tree, to_move)
    new_map: DeviceDict = {
        key: normalize_device(value)  # type: ignore[arg-type]
        for key, value in device_map.items()
    }
    for name in to_move:
        _place(tree, new_map, name, target)
    return MoveResult(
        device_map=new_map,
        moved=tuple(picked),
        tied_partners=tuple(p for p in partners if p in to_move),
        device=target,
    )


def _outermost(tree: ModuleTree, names: Iterable[str]) -> list[str]:
    unique = []
    for name in dict.fromkeys(names):
        if name not in tree:
            raise MoveRefused(f"no module {name!r} in the model; pick a row of the tree")
        unique.append(name)
    chosen = set(unique)
    outer = [n for n in unique if not any(a in chosen for a in _ancestors(n))]
    if "" in chosen:
        outer = [""]
    return sorted(outer, key=lambda n: MapIndex(tree, {}).order_key(n))


def _tied_partners(tree: ModuleTree, picked: list[str]) -> list[str]:
    def inside(module: str) -> bool:
        return any(module == p or module.startswith(p + ".") or p == "" for p in picked)

    partners: list[str] = []
    for group in tree.tied_groups:
        owners = [tree.tensor_owner[t] for t in group]
        if any(inside(o) for o in owners):
            partners.extend(o for o in owners if not inside(o) and o not in partners)
    return partners


def _refuse_no_split(tree: ModuleTree, names: list[str]) -> None:
    offenders = []
    for name in names:
        for ancestor in _ancestors(name):
            node = tree.node(ancestor)
            if node.no_split:
                offenders.append(f"{name} is inside {ancestor} ({node.class_name})")
                break
    if offenders:
        raise MoveRefused(
            f"cannot split a no-split module: {'; '.join(sorted(offenders))}. "
            "Move the whole no-split module instead."
        )


def _place(tree: ModuleTree, device_map: DeviceDict, name: str, target: int | str) -> None:
    """Put ``name`` on ``target``: drop entries below it, split any entry above it."""
    prefix = name + "."
    for key in [k for k in device_map if name in ("", k) or k.startswith(prefix)]:
        del device_map[key]
    path = [name, *_ancestors(name)] if name else [""]
    covering = next((a for a in path[1:] if a in device_map), None)
    if covering is not None:
        old_device = device_map.pop(covering)
        node = tree.node(name)
        while node.name != covering:  # give the siblings along the path the old device
            parent = node.parent
            assert parent is not None  # covering is an ancestor, so the walk ends there
            for sibling in parent.children:
                if sibling is not node:
                    device_map[sibling.name] = old_device
            for tensor_name in parent.tensor_names:
                device_map[tensor_name] = old_device
            node = parent
    device_map[name] = target
    _collapse(tree, device_map, name)


def _collapse(tree: ModuleTree, device_map: DeviceDict, name: str) -> None:
    """Merge sibling entries that all share a device into their parent's entry, upwards."""
    node = tree.node(name)
    while node.parent is not None:
        parent = node.parent
        keys = [c.name for c in parent.children] + list(parent.tensor_names)
        values = {device_map.get(k) for k in keys}
        if len(values) != 1 or None in values:
            return
        for key in keys:
            del device_map[key]
        device_map[parent.name] = values.pop()  # type: ignore[assignment]
        node = parent


_NUMBERED = re.compile(r"^(.*)\.(\d+)$")


def compact_names(names: list[str]) -> list[str]:
    """Collapse runs of numbered siblings: ``layers.0, layers.1, layers.2`` -> ``layers.0-2``.

    Example:
        >>> compact_names(["m.layers.0", "m.layers.1", "m.layers.2", "m.norm"])
        ['m.layers.0-2', 'm.norm']
    """
    out: list[str] = []
    run_base, run_start, run_end = None, -1, -1

    def flush() -> None:
        if run_base is None:
            return
        if run_start == run_end:
            out.append(f"{run_base}.{run_start}")
        else:
            out.append(f"{run_base}.{run_start}-{run_end}")

    for name in names:
        match = _NUMBERED.match(name)
        if match and match.group(1) == run_base and int(match.group(2)) == run_end + 1:
            run_end += 1
            continue
        flush()
        if match:
            run_base, run_start = match.group(1), int(match.group(2))
            run_end = run_start
        else:
            run_base = None
            out.append(name or "(whole model)")
    flush()
    return out


# --- comparing maps ----------------------------------------------------------------------------

NAMES_SHOWN = 12  # a problem names this many modules, then counts the rest


@dataclass(frozen=True)
class MapDiff:
    """What differs between two maps over one tree.

    Attributes:
        moved: ``(name, device before, device after)`` for every map key whose device changed
            (``None`` = uncovered), in model order.
        bytes_before: planning bytes per device under the first map.
        bytes_after: the same under the second.
    """

    moved: list[tuple[str, Any, Any]]
    bytes_before: dict[Any, int]
    bytes_after: dict[Any, int]


def _resolve(index: MapIndex, name: str) -> Any:
    """The device ``name`` (a module, a tensor or a map key) gets under ``index``'s map."""
    node = index.tree.get(name)
    if node is not None:
        return index.device_of(node)
    if name in index.device_map:
        return index.device_map[name]
    owner_name = index.tree.tensor_owner.get(name)
    owner = index.tree.get(owner_name) if owner_name is not None else None
    return index.device_of(owner) if owner is not None else None  # an unknown name: nowhere


def diff_maps(tree: ModuleTree, before: dict[str, Any], after: dict[str, Any]) -> MapDiff:
    """Compare ``before`` and ``after`` key by key (both maps' keys), resolving prefixes."""
    first, second = MapIndex(tree, before), MapIndex(tree, after)
    names = sorted(set(first.device_map) | set(second.device_map), key=first.order_key)
    moved = []
    for name in names:
        old, new = _resolve(first, name), _resolve(second, name)
        if old != new and MIXED not in (old, new):
            moved.append((name, old, new))
    return MapDiff(moved, first.per_device_bytes(), second.per_device_bytes())


def key_problems(tree: ModuleTree, device_map: dict[str, Any], label: str) -> list[str]:
    """Return what is wrong with ``device_map`` over ``tree``: keys naming nothing in the model,
    and modules no key covers, each naming the first few (``"… and 690 more"``)."""
    index = MapIndex(tree, device_map)
    problems = []
    unknown = index.unknown_names()
    if unknown:
        problems.append(
            f"{label} names {len(unknown)} module(s) not in the model: {_some(unknown)}"
        )
    uncovered = compact_names(index.uncovered(limit=len(tree) + len(tree.leaf_tensors)))
    if uncovered:
        problems.append(f"{label} gives no device to {_some(uncovered)}")
    return problems


def _some(names: list[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    rest = len(names) - NAMES_SHOWN
    return f"{shown} … and {rest} more" if rest > 0 else shown
