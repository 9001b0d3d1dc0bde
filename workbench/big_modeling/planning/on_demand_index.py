"""The planner's index: the tree summed in bulk, modules numbered only where it looks.

``ModuleIndex`` numbers every module in a Python loop, microseconds each; on a 98k-module MoE
that loop is most of a plan. Yet the planner looks inside few modules: those that straddle a
device boundary. ``LazyModuleIndex`` numbers the root's children up front, with their bytes,
module counts and largest layers from ``subtree_stats.SubtreeReader`` (C-level passes), and
numbers a module's children only when the planner opens it (``expand``). A subtree of ``n``
modules takes ``n`` preorder positions, so positions equal the eager index's; those inside a
closed module are reserved and never touched.

Exactness: a module or tensor held twice (tied parameters included) or an empty module slot
make ``build_planner_index`` use the eager ``ModuleIndex``, which handles them.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping

import torch
from torch import nn

from workbench.big_modeling.planning.dtype_sizes import as_dtype, dtype_byte_size
from workbench.big_modeling.planning.module_index import BUFFER, PARAMETER, ModuleIndex, TensorEntry
from workbench.big_modeling.planning.subtree_stats import Refused, Stats, SubtreeReader


def build_planner_index(
    model: nn.Module,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    no_split: set[str] | frozenset[str] = frozenset(),
) -> ModuleIndex:
    """The index the planner runs on: lazy when exact, else the eager ``ModuleIndex``.

    ``special_dtypes`` name single tensors, so they need the eager walk.
    """
    if not special_dtypes:
        # The sums allocate small lists; cyclic-GC passes over a big model's millions of
        # objects would cost more than the sums, so the collector waits.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return LazyModuleIndex.build_lazy(model, dtype, frozenset(no_split))
        except Refused:
            pass
        finally:
            if gc_was_enabled:
                gc.enable()
    return ModuleIndex.build(model, dtype=dtype, special_dtypes=special_dtypes)


class LazyModuleIndex(ModuleIndex):
    """A ``ModuleIndex`` whose modules are numbered when the planner opens their parent.

    Positions, sizes, ends and names of numbered modules equal the eager index's; so do
    ``leaf_stats``, ``largest_block`` and every plan (tests compare them).
    """

    _reader: SubtreeReader
    _closed_nodes: set[int]
    _layer_sizes: list[int]
    _no_split: frozenset[str]
    _leaf_stats: tuple[int, int] | None

    @classmethod
    def build_lazy(
        cls, model: nn.Module, dtype: torch.dtype | str | None, no_split: frozenset[str]
    ) -> LazyModuleIndex:
        """Sum ``model`` in bulk; raises ``Refused`` when only the eager walk is exact."""
        index = cls()
        index.dtype_nbytes = dtype_byte_size(as_dtype(dtype)) if dtype is not None else None
        index._no_split = no_split
        index._leaf_stats = None
        reader = index._reader = SubtreeReader(index.itemsize_for, no_split)
        reader.module_ids, reader.tensor_ids = [id(model)], []
        children = list(model._modules.values())
        if None in children:
            raise Refused
        stats = reader.read(children)
        buffers = sum(reader.own_nbytes([model._buffers]))
        nbytes = sum(reader.own_nbytes([model._parameters])) + buffers
        module_ids, tensor_ids = reader.module_ids, reader.tensor_ids
        if len(set(module_ids)) != len(module_ids) or len(set(tensor_ids)) != len(tensor_ids):
            raise Refused  # a shared module, tied parameters or a shared buffer
        reader.module_ids = reader.tensor_ids = None
        for child in stats:
            nbytes += child.nbytes
            buffers += child.buffer_nbytes
        count = 1 + sum(child.count for child in stats)
        index.modules = [None] * count  # type: ignore[list-item]  # filled when numbered
        index.short_names = [""] * count
        index.parents = [-1] * count
        index.ends = [0] * count
        index.sizes = [0] * count
        index._class_names = [""] * count
        index.buffer_sizes = [0] * count
        index._layer_sizes = [0] * count
        index._closed_nodes = set()
        index._number(0, model, "", Stats(nbytes, buffers, count, 0))
        index._number_children(0, stats)
        return index

    # -- numbering -----------------------------------------------------------------------------

    def _number(self, position: int, module: nn.Module, name: str, stats: Stats) -> None:
        self.modules[position] = module
        self.short_names[position] = name
        self.sizes[position] = stats.nbytes
        self.ends[position] = position + stats.count
        self._class_names[position] = type(module).__name__  # type: ignore[index]
        self.buffer_sizes[position] = stats.buffer_nbytes
        self._layer_sizes[position] = stats.layer
        if stats.count > 1:
            self._closed_nodes.add(position)

    def _number_children(self, position: int, stats: list[Stats]) -> None:
        self._closed_nodes.discard(position)
        parents = self.parents
        child = position + 1
        for (name, module), child_stats in zip(
            self.modules[position]._modules.items(), stats, strict=True
        ):
            self._number(child, module, name, child_stats)
            parents[child] = position
            child += child_stats.count

    def expand(self, position: int) -> bool:
        """Number the children of ``position`` if that is not done yet; True if it was not."""
        if position not in self._closed_nodes:
            return False
        children = list(self.modules[position]._modules.values())
        cache = self._reader.cache
        missing = [child for child in children if id(child) not in cache]
        if missing:
            self._reader.read(missing)
        self._number_children(position, [cache[id(child)] for child in children])
        return True

    # -- what the planner reads ----------------------------------------------------------------

    def _closed(self, position: int) -> bool:
        return position in self._closed_nodes

    def _layer_nbytes(self, position: int, no_split: set[str] | frozenset[str]) -> int:
        if position in self._closed_nodes and self._class_names[position] not in no_split:  # type: ignore[index]
            return self._layer_sizes[position]
        return self.sizes[position]

    def child_positions(self, position: int) -> list[int]:
        """Positions of the child modules of module ``position``; ``expand`` it first."""
        if position in self._closed_nodes:
            raise RuntimeError(f"module {position} is not opened yet; call expand() first")
        return super().child_positions(position)

    def tensors_of(self, owner: int) -> list[TensorEntry]:
        """Direct parameters then direct buffers of module ``owner``, with their bytes."""
        module = self.modules[owner]
        entries = []
        for tensors, kind in ((module._parameters, PARAMETER), (module._buffers, BUFFER)):
            for attr, tensor in tensors.items():
                if tensor is not None:
                    nbytes = int(tensor.numel() * self.itemsize_for(tensor.dtype))
                    entries.append(TensorEntry(owner, kind, attr, nbytes))
        return entries

    def leaf_stats(self) -> tuple[int, int]:
        """``(count, total bytes)`` of the leaf modules holding bytes (root excluded)."""
        if self._leaf_stats is None:
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                self._leaf_stats = self._reader.leaf_stats(self.modules[0])
            finally:
                if gc_was_enabled:
                    gc.enable()
        return self._leaf_stats

    def largest_block(self, classes: set[str] | frozenset[str]) -> int:
        """Bytes of the largest module (root excluded) whose class name is in ``classes``."""
        if frozenset(classes) != self._no_split:
            raise ValueError("a lazy index answers for the no-split classes it was built with")
        return self._reader.largest_block

    def all_sizes(self) -> dict[str, int]:
        """Not offered: a lazy index numbers only what the planner opens."""
        raise NotImplementedError("use ModuleIndex.build(model).all_sizes()")
