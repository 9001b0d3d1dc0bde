"""A flat, one-pass index of a module tree: the data the size accounting and planner run on.

``ModuleIndex.build(model)`` walks the modules once (``_modules``, ``_parameters``,
``_buffers``), numbers them in preorder and sums each module's bytes. Module ``i``'s subtree is
the position range ``[i, ends[i])``, so "is this module inside that one" is two integer
comparisons, never a prefix scan. Full names and per-tensor entries are made only on demand
(``name_of``, ``tensors_of``): the planner needs them for the few modules it splits, and a
98k-module tree costs little more than one ``named_parameters()`` pass.

The planner itself uses ``on_demand_index.LazyModuleIndex``, which sums the tree in bulk and
numbers modules only where it looks; this eager index is its fallback and the reference.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import repeat

import torch
from torch import nn

from workbench.big_modeling.planning.dtype_sizes import as_dtype, dtype_byte_size, element_nbytes

__all__ = ["BUFFER", "PARAMETER", "ModuleIndex", "TensorEntry"]

PARAMETER, BUFFER = 1, 2  # TensorEntry.kind


@dataclass(frozen=True)
class TensorEntry:
    """One direct parameter or buffer of an indexed module."""

    owner: int
    kind: int  # PARAMETER or BUFFER
    attr: str
    nbytes: int  # 0 for the repeated names of a tied parameter (counted at its first name)


@dataclass
class ModuleIndex:
    """Preorder arrays over the modules of a model (see the module docstring)."""

    modules: list[nn.Module] = field(default_factory=list)
    short_names: list[str] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    #: bytes of each module's subtree, weights and buffers, under the planning dtype
    sizes: list[int] = field(default_factory=list)
    #: bytes of the buffers in each module's subtree
    buffer_sizes: list[int] = field(default_factory=list)
    _class_names: list[str] | None = None
    _leaves: list[int] | None = None
    #: groups of tied parameters as (owner position, attribute name), first occurrence first
    tied_groups: list[list[tuple[int, str]]] = field(default_factory=list)
    dtype_nbytes: int | float | None = None
    special_nbytes: dict[str, int | float] = field(default_factory=dict)
    #: id(tensor) -> position of the module that holds it first
    _first_owner: dict[int, int] = field(default_factory=dict)
    _names: dict[int, str] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        model: nn.Module,
        dtype: torch.dtype | str | None = None,
        special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    ) -> ModuleIndex:
        """Index ``model`` in one walk; sizes use ``dtype``/``special_dtypes`` as loading would."""
        index = cls()
        index.dtype_nbytes = dtype_byte_size(as_dtype(dtype)) if dtype is not None else None
        index.special_nbytes = {
            name: dtype_byte_size(as_dtype(value)) for name, value in (special_dtypes or {}).items()
        }
        # The walk allocates few objects, but a cyclic-GC pass over a big model's millions of
        # objects costs more than the walk itself; pause the collector for its duration.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            index._walk(model)
        finally:
            if gc_was_enabled:
                gc.enable()
        index._finish()
        return index

    def resized(self, sizes: list[int]) -> ModuleIndex:
        """A copy with other subtree ``sizes`` (one per position) that shares everything else.

        For planning one model many times with different sizes (the joint precision planner
        places every candidate): the walk is done once. The copy shares the module list, the
        names and the caches made so far, so make ``class_names``, ``leaf_positions()`` and the
        names you need on this index first; nothing but ``sizes`` is written by the planner.

        Raises:
            ValueError: ``sizes`` does not have one entry per module.

        Example:
            >>> index = ModuleIndex.build(nn.Sequential(nn.Linear(2, 2)))
            >>> index.sizes, index.resized([10, 10]).sizes
            ([24, 24], [10, 10])
        """
        if len(sizes) != len(self.sizes):
            raise ValueError(f"{len(sizes)} sizes for an index of {len(self.sizes)} modules")
        return dataclasses.replace(self, sizes=sizes)

    def _walk(self, model: nn.Module) -> None:
        # The hot loop of planning: one iteration per module, so it touches each module's
        # three dicts once, pushes children with C-level zip (no per-child Python frame) and
        # leaves class names, full names and per-tensor entries for later (on demand).
        modules, short_names, parents = self.modules, self.short_names, self.parents
        sizes, buffer_sizes = self.sizes, self.buffer_sizes
        first_owner = self._first_owner
        tied: dict[int, list[tuple[int, str]]] = {}
        itemsizes: dict[torch.dtype, int | float] = {}
        itemsize_for = self.itemsize_for
        special = bool(self.special_nbytes)
        seen: set[int] = set()
        modules_append, short_names_append = modules.append, short_names.append
        parents_append, sizes_append = parents.append, sizes.append
        seen_add = seen.add

        stack: list[tuple[str, nn.Module | None, int]] = [("", model, -1)]
        pop, push = stack.pop, stack.extend
        me = -1
        while stack:
            short_name, module, parent = pop()
            if module is None or id(module) in seen:
                continue  # an empty slot, or a module shared under two names (counted once)
            seen_add(id(module))
            me += 1
            modules_append(module)
            short_names_append(short_name)
            parents_append(parent)
            nbytes = 0
            for attr, tensor in module._parameters.items():
                if tensor is None:
                    continue
                key = id(tensor)
                first = first_owner.get(key)
                if first is None:
                    first_owner[key] = me
                    if special:
                        nbytes += self._tensor_nbytes(me, attr, tensor, itemsizes)
                        continue
                    itemsize = itemsizes.get(tensor.dtype)
                    if itemsize is None:
                        itemsize = itemsizes[tensor.dtype] = itemsize_for(tensor.dtype)
                    nbytes += int(tensor.numel() * itemsize)
                else:  # a tied parameter: counted once, at its first name
                    group = tied.get(key)
                    if group is None:
                        group = tied[key] = [(first, self._attr_of(first, tensor))]
                    group.append((me, attr))
            buffer_nbytes = 0
            if module._buffers:
                for attr, tensor in module._buffers.items():
                    if tensor is not None and id(tensor) not in first_owner:
                        first_owner[id(tensor)] = me
                        buffer_nbytes += self._tensor_nbytes(me, attr, tensor, itemsizes)
                nbytes += buffer_nbytes
            sizes_append(nbytes)
            buffer_sizes.append(buffer_nbytes)
            submodules = module._modules
            if submodules:
                push(zip(reversed(submodules), reversed(submodules.values()), repeat(me)))
        self.tied_groups = list(tied.values())

    def _tensor_nbytes(
        self, owner: int, attr: str, tensor: torch.Tensor, itemsizes: dict[torch.dtype, int | float]
    ) -> int:
        itemsize = self._special_itemsize(owner, attr) if self.special_nbytes else None
        if itemsize is None:
            itemsize = itemsizes.get(tensor.dtype)
            if itemsize is None:
                itemsize = itemsizes[tensor.dtype] = self.itemsize_for(tensor.dtype)
        return int(tensor.numel() * itemsize)

    def _attr_of(self, owner: int, tensor: torch.Tensor) -> str:
        """The first attribute name under which module ``owner`` holds ``tensor``."""
        return next(
            attr for attr, held in self.modules[owner]._parameters.items() if held is tensor
        )

    def _finish(self) -> None:
        # Children follow their parent in preorder, so a reverse sweep sees every module after
        # its whole subtree: it adds the subtree's bytes (and buffer bytes) to the parent, and the first child met
        # (the last child) carries the parent's end.
        count = len(self.modules)
        ends = list(range(1, count + 1))
        sizes, buffer_sizes, parents = self.sizes, self.buffer_sizes, self.parents
        for position in range(count - 1, 0, -1):
            parent = parents[position]
            sizes[parent] += sizes[position]
            buffer_sizes[parent] += buffer_sizes[position]
            if ends[parent] == parent + 1:
                ends[parent] = ends[position]
        self.ends = ends

    @property
    def class_names(self) -> list[str]:
        """Class name of each module, in preorder (made on first use)."""
        names = self._class_names
        if names is None:
            names = self._class_names = [type(module).__name__ for module in self.modules]
        return names

    def leaf_positions(self) -> list[int]:
        """Positions of the modules without child modules, root excluded (made on first use)."""
        leaves = self._leaves
        if leaves is None:
            ends = self.ends
            leaves = self._leaves = [p for p in range(1, len(ends)) if ends[p] == p + 1]
        return leaves

    def leaf_stats(self) -> tuple[int, int]:
        """``(count, total bytes)`` of the leaf modules holding bytes (root excluded)."""
        sizes = self.sizes
        leaf_sizes = [sizes[p] for p in self.leaf_positions() if sizes[p]]
        return len(leaf_sizes), sum(leaf_sizes)

    def largest_block(self, classes: set[str] | frozenset[str]) -> int:
        """Bytes of the largest module (root excluded) whose class name is in ``classes``."""
        if not classes:
            return 0
        names, sizes = self.class_names, self.sizes
        return max((sizes[p] for p in range(1, len(sizes)) if names[p] in classes), default=0)

    # -- what the planner opens ---------------------------------------------------------------

    def expand(self, position: int) -> bool:
        """Number the children of ``position`` if that is not done yet; True if it was not.

        Every module of this eager index is numbered already; ``LazyModuleIndex`` numbers them
        when the planner first looks inside.
        """
        return False

    def layer_points(
        self, no_split: set[str] | frozenset[str], under: int = 0
    ) -> tuple[list[int], list[int]]:
        """Layers below ``under``, as ``(positions, bytes)``: the "largest layer still to place".

        A layer is a module without child modules or of a ``no_split`` class (not looked into);
        a module not numbered inside yet stands for its subtree, with its largest layer.
        """
        positions: list[int] = []
        values: list[int] = []
        ends, class_names = self.ends, self.class_names
        position, end = under + 1, ends[under]
        while position < end:
            if (
                ends[position] > position + 1
                and class_names[position] not in no_split
                and not self._closed(position)
            ):
                position += 1
                continue
            positions.append(position)
            values.append(self._layer_nbytes(position, no_split))
            position = ends[position]
        return positions, values

    def _closed(self, position: int) -> bool:
        """True for a module with children that are not numbered yet (lazy index)."""
        return False

    def _layer_nbytes(self, position: int, no_split: set[str] | frozenset[str]) -> int:
        return self.sizes[position]

    # -- sizes ------------------------------------------------------------------------------

    def itemsize_for(self, stored: torch.dtype) -> int | float:
        """Bytes per element once loaded: floating tensors take ``dtype``, others their own."""
        if self.dtype_nbytes is None or not (stored.is_floating_point or stored.is_complex):
            return element_nbytes(stored)
        return self.dtype_nbytes

    def _special_itemsize(self, owner: int, attr: str) -> int | float | None:
        return self.special_nbytes.get(self.tensor_name(owner, attr))

    def tensors_of(self, owner: int) -> list[TensorEntry]:
        """Direct parameters then direct buffers of module ``owner``, with their bytes."""
        module = self.modules[owner]
        entries, counted = [], set()
        for tensors, kind in ((module._parameters, PARAMETER), (module._buffers, BUFFER)):
            for attr, tensor in tensors.items():
                if tensor is None:
                    continue
                nbytes = 0
                if self._first_owner.get(id(tensor)) == owner and id(tensor) not in counted:
                    counted.add(id(tensor))
                    itemsize = self._special_itemsize(owner, attr) if self.special_nbytes else None
                    if itemsize is None:
                        itemsize = self.itemsize_for(tensor.dtype)
                    nbytes = int(tensor.numel() * itemsize)
                entries.append(TensorEntry(owner, kind, attr, nbytes))
        return entries

    def child_positions(self, position: int) -> list[int]:
        """Positions of the child modules of module ``position``, in order."""
        result, child, end = [], position + 1, self.ends[position]
        while child < end:
            result.append(child)
            child = self.ends[child]
        return result

    def has_children(self, position: int) -> bool:
        """True when module ``position`` has at least one child module."""
        return self.ends[position] > position + 1

    def buffer_nbytes(self, position: int) -> int:
        """Bytes of the buffers in module ``position``'s subtree."""
        return self.buffer_sizes[position]

    def depth_of(self, position: int) -> int:
        """Number of ancestors of module ``position``."""
        depth = 0
        while position > 0:
            position = self.parents[position]
            depth += 1
        return depth

    # -- names ------------------------------------------------------------------------------

    def name_of(self, position: int) -> str:
        """Full dotted name of module ``position`` (``""`` for the root)."""
        name = self._names.get(position)
        if name is None:
            parent = self.parents[position]
            if parent <= 0:
                name = self.short_names[position]
            else:
                name = f"{self.name_of(parent)}.{self.short_names[position]}"
            self._names[position] = name
        return name

    def tensor_name(self, owner: int, attr: str) -> str:
        """Full dotted name of tensor ``attr`` of module ``owner``."""
        prefix = self.name_of(owner)
        return f"{prefix}.{attr}" if prefix else attr

    def all_sizes(self) -> dict[str, int]:
        """``{name: nbytes}`` for every module and tensor, ``""`` for the whole model."""
        result: dict[str, int] = {}
        for position in range(len(self.modules)):
            result[self.name_of(position)] = self.sizes[position]
            for entry in self.tensors_of(position):
                result[self.tensor_name(position, entry.attr)] = entry.nbytes
        return result
