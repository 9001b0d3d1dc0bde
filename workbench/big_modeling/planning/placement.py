"""The greedy placement pass behind ``infer_auto_device_map``, in linear time.

Rules (Accelerate's, restated): walk the model's items (direct parameters, child modules, direct
buffers) in order and put each on the current device while it fits; when it does not, split it
into its items if it may be split, otherwise move on to the next device (GPUs by index, mps,
cpu, disk). On the *main* devices (GPU 0 and the CPU when there are GPUs; the CPU alone
otherwise) room is kept for the largest layer still to place, so an offloaded layer can be
brought back; we skip that room when everything left fits on the device anyway. Tied
parameters travel together. ``reserve`` bytes per device are never used by weights.

Why it is fast: the tree is a preorder index (``module_index``), so "the largest layer still
to place" is a suffix maximum over layers in preorder (a max segment tree, updated only when a
module is placed out of order for a tie or a fallback), the queue is a heap of preorder
positions, and "which queued module holds this tied parameter" is a walk up its parents.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from workbench.big_modeling.devices import Device, device_label
from workbench.big_modeling.errors import MemoryBudgetError
from workbench.big_modeling.planning.largest_layer import SuffixMax
from workbench.big_modeling.planning.module_index import BUFFER, PARAMETER, ModuleIndex, TensorEntry
from workbench.big_modeling.planning.sizes import format_nbytes

_WAITING, _QUEUED, _SPLIT, _PLACED = 0, 1, 2, 3


@dataclass(frozen=True)
class _Room:
    """Where a decision is made: the device, bytes used there, the weight budget, kept room."""

    device: Device
    used: int
    budget: int | None
    layer_room: int


@dataclass
class PlacementRecord:
    """One decision of the pass: ``device`` is ``None`` for a module split into its items."""

    name: str
    device: Device | None
    nbytes: int
    reason: str


@dataclass
class PassResult:
    """What the pass produced, in placement order."""

    assignments: list[tuple[str, Device]] = field(default_factory=list)
    records: list[PlacementRecord] = field(default_factory=list)
    used_nbytes: dict[Device, int] = field(default_factory=dict)
    offloaded_buffer_nbytes: int = 0
    # room kept for the largest later layer on each device the pass left (reference: "reserved")
    reserved_nbytes: dict[Device, int] = field(default_factory=dict)
    # devices the pass left empty -> the bytes the first module it tried there needed
    unfilled_nbytes: dict[Device, int] = field(default_factory=dict)


def run_placement(
    index: ModuleIndex,
    devices: list[Device],
    capacities: dict[Device, int | None],
    reserves: dict[Device, int],
    no_split_module_classes: set[str],
    *,
    fallback_allocation: bool = False,
    explain: bool = False,
) -> PassResult:
    """Place every item of ``index`` on ``devices`` (in order) within ``capacities``.

    ``capacities`` are net of ``reserves`` (``None``: unlimited, the usual disk);
    ``reserves`` only feed the reasons. With ``explain``, every decision gets a reason.

    Raises:
        MemoryBudgetError: when the last device is full (only with a finite disk budget).
    """
    return _Pass(
        index,
        devices=devices,
        capacities=capacities,
        reserves=reserves,
        no_split=no_split_module_classes,
        fallback_allocation=fallback_allocation,
        explain=explain,
    ).run()


class _Pass:
    def __init__(
        self,
        index: ModuleIndex,
        *,
        devices: list[Device],
        capacities: dict[Device, int | None],
        reserves: dict[Device, int],
        no_split: set[str],
        fallback_allocation: bool,
        explain: bool,
    ) -> None:
        self.index = index
        self.devices = devices
        self.capacities = capacities
        self.reserves = reserves
        self.no_split = no_split
        self.fallback_allocation = fallback_allocation
        self.explain = explain
        accelerators = [d for d in devices if d not in ("cpu", "disk")]
        if "mps" in accelerators:
            self.main_devices = {"mps"}
        elif accelerators:
            self.main_devices = {accelerators[0], "cpu"}
        else:
            self.main_devices = {"cpu"}
        self.module_count = len(index.modules)
        # Items are module positions, then tensors numbered from module_count when their
        # module is split (self.tensors[item - module_count]).
        self.state = [_WAITING] * self.module_count
        self.tensors: list[TensorEntry] = []
        self.tensor_items: dict[tuple[int, str], int] = {}
        self.parts_cache: dict[int, list[int]] = {}
        self.layers = self._layer_tree()
        self.result = PassResult(used_nbytes=dict.fromkeys(devices, 0))
        self.remaining_nbytes = index.sizes[0]
        self.rejections: dict[int, list[str]] = {}

    # -- items ------------------------------------------------------------------------------

    def _size(self, item: int) -> int:
        if item < self.module_count:
            return self.index.sizes[item]
        return self.tensors[item - self.module_count].nbytes

    def _buffer_size(self, item: int) -> int:
        if item < self.module_count:
            return self.index.buffer_nbytes(item)
        entry = self.tensors[item - self.module_count]
        return entry.nbytes if entry.kind == BUFFER else 0

    def _name(self, item: int) -> str:
        if item < self.module_count:
            return self.index.name_of(item)
        entry = self.tensors[item - self.module_count]
        return self.index.tensor_name(entry.owner, entry.attr)

    def _key(self, item: int) -> tuple[int, int, int, int]:
        """Heap key: preorder, a module's parameters before its children, buffers after."""
        if item < self.module_count:
            return (item, 0, 0, 0)
        entry = self.tensors[item - self.module_count]
        if entry.kind == BUFFER:
            owner = entry.owner
            return (self.index.ends[owner] - 1, 2, -self.index.depth_of(owner), item)
        return (entry.owner, 1, item, 0)

    def _after(self, item: int) -> int:
        """First module position after ``item`` in placement order (for the layer maximum)."""
        if item < self.module_count:
            return self.index.ends[item]
        entry = self.tensors[item - self.module_count]
        return self.index.ends[entry.owner] if entry.kind == BUFFER else entry.owner + 1

    def _parent(self, item: int) -> int:
        if item < self.module_count:
            return self.index.parents[item]
        return self.tensors[item - self.module_count].owner

    def _parts(self, module: int) -> list[int]:
        """Direct parameters, child modules, direct buffers of ``module``, as items."""
        parts = self.parts_cache.get(module)
        if parts is None:
            self._open(module)
            params, buffers = [], []
            for entry in self.index.tensors_of(module):
                item = self.module_count + len(self.tensors)
                self.tensors.append(entry)
                self.state.append(_WAITING)
                self.tensor_items[(module, entry.attr)] = item
                (buffers if entry.kind == BUFFER else params).append(item)
            parts = self.parts_cache[module] = [
                *params,
                *self.index.child_positions(module),
                *buffers,
            ]
        return parts

    def _splittable(self, item: int) -> bool:
        index = self.index
        return (
            item < self.module_count
            and index.has_children(item)
            and index.class_names[item] not in self.no_split
        )

    def _layer_tree(self) -> SuffixMax:
        """Layers: modules without child modules, or of a no-split class (not looked into)."""
        positions, sizes = self.index.layer_points(self.no_split)
        return SuffixMax(self.module_count, positions, sizes)

    def _open(self, module: int) -> None:
        """Let a lazy index number ``module``'s children; its largest layer moves to them."""
        if self.index.expand(module):
            self.layers.set(module, 0)
            positions, sizes = self.index.layer_points(self.no_split, module)
            for position, nbytes in zip(positions, sizes, strict=True):
                self.layers.set(position, nbytes)

    # -- tied parameters --------------------------------------------------------------------

    def _holds(self, item: int, member: tuple[int, str]) -> bool:
        if item < self.module_count:
            return item <= member[0] < self.index.ends[item]
        entry = self.tensors[item - self.module_count]
        return entry.kind == PARAMETER and (entry.owner, entry.attr) == member

    def _queued_holder(self, member: tuple[int, str]) -> int:
        """The queued item holding tied parameter ``member`` (-1 if it is already placed)."""
        owner, attr = member
        state = self.state
        if state[owner] == _SPLIT:
            item = self.tensor_items[(owner, attr)]
            return item if state[item] == _QUEUED else -1
        position = owner
        while position >= 0:
            if state[position] == _QUEUED:
                return position
            if state[position] == _PLACED:
                return -1
            position = self.index.parents[position]
        return -1

    def _tied_holders(self, item: int) -> list[int]:
        """Queued items outside ``item`` holding parameters tied to one inside it."""
        holders: list[int] = []
        for group in self.index.tied_groups:
            inside = [self._holds(item, member) for member in group]
            if not any(inside) or all(inside):
                continue
            for member, is_inside in zip(group, inside, strict=True):
                if not is_inside:
                    holder = self._queued_holder(member)
                    if holder >= 0 and holder not in holders:
                        holders.append(holder)
        return holders

    # -- the pass ---------------------------------------------------------------------------

    def run(self) -> PassResult:
        heap: list[tuple[tuple[int, int, int, int], int]] = []
        for item in self._parts(0):
            self.state[item] = _QUEUED
            heap.append((self._key(item), item))
        heapq.heapify(heap)
        device_number = 0
        while heap:
            _, item = heapq.heappop(heap)
            if self.state[item] != _QUEUED:
                continue  # placed early with a tied partner
            device = self.devices[device_number]
            capacity = self.capacities[device]
            used = self.result.used_nbytes[device]
            layer_room = 0
            needs_room = capacity is not None and device in self.main_devices
            if needs_room and used + self.remaining_nbytes > capacity:
                layer_room = self.layers.query_from(self._after(item))
            budget = None if capacity is None else capacity - layer_room
            room = _Room(device, used, budget, layer_room)
            nbytes = self._size(item)
            holders = self._tied_holders(item)
            nbytes_with_ties = nbytes + sum(self._size(holder) for holder in holders)

            if budget is None or used + nbytes_with_ties <= budget:
                self._assign(item, holders, room)
                continue
            if holders and used + nbytes <= budget:
                splittable = [holder for holder in holders if self._splittable(holder)]
                if splittable:
                    self._split(splittable[0], heap, room)
                    heapq.heappush(heap, (self._key(item), item))
                    continue
            if self._splittable(item):
                self._split(item, heap, room)
                continue
            if self.fallback_allocation and used == 0 and device != "disk" and capacity is not None:
                limit = capacity - max(layer_room, nbytes_with_ties)
                if self._place_fallback(heap, _Room(device, 0, limit, layer_room)):
                    heapq.heappush(heap, (self._key(item), item))
                    continue
            if self.explain:
                why = self._no_fit_text(item, nbytes_with_ties, room)
                self.rejections.setdefault(item, []).append(why)
            self.result.reserved_nbytes[device] = layer_room
            if used == 0:
                self.result.unfilled_nbytes[device] = nbytes_with_ties + layer_room
            device_number += 1
            if device_number == len(self.devices):
                raise self._out_of_room(item, nbytes_with_ties)
            heapq.heappush(heap, (self._key(item), item))
        return self.result

    def _assign(self, item: int, holders: list[int], room: _Room) -> None:
        result, device = self.result, room.device
        items = [item, *holders]
        for placed in items:
            self.state[placed] = _PLACED
            nbytes = self._size(placed)
            result.assignments.append((self._name(placed), device))
            result.used_nbytes[device] += nbytes
            self.remaining_nbytes -= nbytes
            if device in ("cpu", "disk"):
                result.offloaded_buffer_nbytes += self._buffer_size(placed)
            if placed != item:
                self._forget_layers(placed)
        if self.explain:
            total = sum(self._size(placed) for placed in items)
            reason = self._fit_text(item, holders, total, room)
            name = self._name(item)
            result.records.append(PlacementRecord(name, device, self._size(item), reason))
            for holder in holders:
                holder_name = self._name(holder)
                why = f"{holder_name} goes with {name} (tied parameters): {reason}"
                result.records.append(PlacementRecord(holder_name, device, self._size(holder), why))

    def _forget_layers(self, item: int) -> None:
        """``item`` was placed out of order: its layers no longer count as "still to place"."""
        if item < self.module_count:
            self.layers.remove_range(item, self.index.ends[item])

    def _split(self, item: int, heap: list, room: _Room) -> None:
        self.state[item] = _SPLIT
        for part in self._parts(item):
            self.state[part] = _QUEUED
            heapq.heappush(heap, (self._key(part), part))
        if self.explain:
            nbytes = self._size(item)
            why = self._no_fit_text(item, nbytes, room)
            self.result.records.append(
                PlacementRecord(self._name(item), None, nbytes, f"split into its parts: {why}")
            )

    def _place_fallback(self, heap: list, room: _Room) -> bool:
        """Find the first queued item (depth first) that fits in ``room`` and place it."""
        limit = room.budget or 0
        search = [item for _, item in sorted(heap) if self.state[item] == _QUEUED]
        search.reverse()  # a stack: the last element is the next to look at
        while search:
            item = search.pop()
            holders = self._tied_holders(item)
            if self._size(item) + sum(self._size(h) for h in holders) <= limit:
                break
            if self._splittable(item):
                search.extend(reversed(self._parts(item)))
        else:
            return False
        # Split the queued ancestors of the chosen item so that it stands alone in the queue.
        path = []
        ancestor = item
        while self.state[ancestor] != _QUEUED:
            ancestor = self._parent(ancestor)
            path.append(ancestor)
        for parent in reversed(path):
            self.state[parent] = _SPLIT
            for part in self._parts(parent):
                self.state[part] = _QUEUED
                heapq.heappush(heap, (self._key(part), part))
        self._forget_layers(item)
        self._assign(item, self._tied_holders(item), room)
        return True

    def _out_of_room(self, position: int, nbytes: int) -> MemoryBudgetError:
        name = self._name(position) or "the model"
        budgets = ", ".join(
            f"{device_label(d)}={format_nbytes(c)}"
            for d, c in self.capacities.items()
            if c is not None
        )
        return MemoryBudgetError(
            f"{name} ({format_nbytes(nbytes)}) fits on no device: every budget is full "
            f"({budgets}). Raise a budget in max_memory, lower a reserve, or allow 'disk' "
            "without a limit."
        )

    # -- reasons ----------------------------------------------------------------------------

    def _left_text(self, room: _Room) -> str:
        if room.budget is None:
            return "no limit"
        left = room.budget - room.used
        text = f"{format_nbytes(left)} left" if left > 0 else "nothing left"
        extras = []
        reserve = self.reserves.get(room.device, 0)
        if reserve:
            extras.append(f"the {format_nbytes(reserve)} reserve")
        if room.layer_room:
            extras.append(f"{format_nbytes(room.layer_room)} kept for the largest offloaded layer")
        return f"{text} after {' and '.join(extras)}" if extras else text

    def _no_fit_text(self, position: int, nbytes: int, room: _Room) -> str:
        name = self._name(position)
        return (
            f"{name} does not fit on {device_label(room.device)}: "
            f"{format_nbytes(nbytes)} needed, {self._left_text(room)}"
        )

    def _fit_text(self, position: int, holders: list[int], nbytes: int, room: _Room) -> str:
        name = self._name(position)
        text = (
            f"{name} fits on {device_label(room.device)}: "
            f"{format_nbytes(nbytes)} needed, {self._left_text(room)}"
        )
        if holders:
            tied = ", ".join(self._name(holder) for holder in holders)
            text += f" (with {tied}, tied to it)"
        earlier = self.rejections.pop(position, [])
        return "; ".join([*earlier, text])
