"""Bulk statistics of module subtrees, for the planner's lazy index.

A Python loop over modules costs microseconds per module; the planner only needs, for the few
modules it numbers, each one's bytes, buffer bytes, module count and largest layer. ``SubtreeReader``
gets those for a list of subtrees with C-level ``map``/``chain``/``accumulate`` passes, one
breadth-first level at a time:

- each level of all the subtrees is one list; a subtree's modules at a level are a contiguous
  range of it, so per-subtree totals are differences of prefix sums;
- a module's own bytes are a prefix-sum difference over the level's flattened tensors;
- modules of a no-split class ("blocks") are summed whole and not looked into.

One read answers for the given roots and, in the same passes, for each root's children (kept
in a cache), so the index can open a module without reading its subtree again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from itertools import accumulate, chain, compress, islice, repeat
from operator import add, attrgetter, is_not, mul, not_, sub
from typing import NamedTuple

import torch
from torch import nn

_GET_DICTS = attrgetter("_modules", "_parameters", "_buffers")
_GET_MODULES = attrgetter("_modules")
_GET_DTYPE = attrgetter("dtype")
_NUMEL = torch.Tensor.numel
_NOT_NONE = partial(is_not, None)
_MAX = partial(max, default=0)
_NOTHING = torch.empty(0, device="meta")
_CACHED_DEPTH = 2  # a read also answers for the roots' children and grandchildren
_CHUNK = 512  # modules per pass: their objects, dicts and tensors stay in the CPU cache  # stands in for an empty tensor slot in sums


class Refused(Exception):
    """The bulk sums cannot say this tree exactly (a shared module or tensor, an empty slot)."""


class Stats(NamedTuple):
    """What the planner needs of a subtree."""

    nbytes: int
    buffer_nbytes: int
    count: int  # modules, the subtree's root included
    layer: int  # bytes of its largest layer (a module without children, or a block)


def _prefix(values: Iterable[int]) -> list[int]:
    return list(accumulate(values, initial=0))


def _range_sums(prefix: list[int], bounds: list[int]) -> list[int]:
    return list(
        map(sub, map(prefix.__getitem__, islice(bounds, 1, None)), map(prefix.__getitem__, bounds))
    )


def _range_maxima(values: list[int], bounds: list[int]) -> list[int]:
    slices = map(slice, bounds, islice(bounds, 1, None))
    return list(map(_MAX, map(values.__getitem__, slices)))


class SubtreeReader:
    """Reads subtrees in bulk; ``check`` also collects ids to find shared modules and tensors."""

    def __init__(
        self, itemsize_for: Callable[[torch.dtype], int | float], blocks: frozenset[str]
    ) -> None:
        self.itemsize_for = itemsize_for
        self.blocks = blocks
        self.itemsizes: dict[torch.dtype, int | float] = {}
        self.block_flags: dict[type, bool] = {}
        self.cache: dict[int, Stats] = {}  # id(module) -> stats, for children of read roots
        self.largest_block = 0
        self.module_ids: list[int] | None = None
        self.tensor_ids: list[int] | None = None

    # -- tensors ------------------------------------------------------------------------------

    def tensor_nbytes(self, tensors: list[torch.Tensor | None]) -> list[int]:
        """Bytes of each tensor under the planning dtype (0 for an empty slot)."""
        present = list(filter(_NOT_NONE, tensors))
        if self.tensor_ids is not None:
            self.tensor_ids += map(id, present)
        if len(present) != len(tensors):
            tensors = [_NOTHING if tensor is None else tensor for tensor in tensors]
        return self._nbytes(tensors)

    def _nbytes(self, tensors: list[torch.Tensor]) -> list[int]:
        dtypes = list(map(_GET_DTYPE, tensors))
        kinds = set(dtypes)
        itemsizes = self.itemsizes
        for dtype in kinds - itemsizes.keys():
            itemsizes[dtype] = self.itemsize_for(dtype)
        if len(kinds) == 1:
            sizes: Iterable = repeat(itemsizes[dtypes[0]])
        else:
            sizes = map(itemsizes.__getitem__, dtypes)
        nbytes = list(map(mul, map(_NUMEL, tensors), sizes))
        if not all(isinstance(itemsizes[dtype], int) for dtype in kinds):
            nbytes = list(map(int, nbytes))
        return nbytes

    def own_nbytes(self, dicts: tuple[dict, ...] | list[dict]) -> list[int]:
        """Bytes of each module's direct tensors, given its ``_parameters`` or ``_buffers``."""
        counts = list(map(len, dicts))
        if not any(counts):
            return [0] * len(counts)
        tensors = list(chain.from_iterable(map(dict.values, dicts)))
        return _range_sums(_prefix(self.tensor_nbytes(tensors)), _prefix(counts))

    # -- blocks -------------------------------------------------------------------------------

    def _is_block(self, kind: type) -> bool:
        flag = self.block_flags.get(kind)
        if flag is None:
            flag = self.block_flags[kind] = kind.__name__ in self.blocks
        return flag

    def block_stats(self, block: nn.Module) -> Stats:
        """Stats of a block, summed whole (its largest layer is itself)."""
        count = 0
        params: list[torch.Tensor | None] = []
        buffers: list[torch.Tensor | None] = []
        level = [block]
        while level:
            count += len(level)
            try:
                child_dicts, param_dicts, buffer_dicts = zip(*map(_GET_DICTS, level), strict=True)
            except AttributeError:  # None in a module slot
                raise Refused from None
            params += chain.from_iterable(map(dict.values, param_dicts))
            if any(map(len, buffer_dicts)):  # most modules have none: no view per dict then
                buffers += chain.from_iterable(map(dict.values, buffer_dicts))
            level = list(chain.from_iterable(map(dict.values, child_dicts)))
            if self.module_ids is not None:
                self.module_ids += map(id, level)  # the block itself is counted with its level
        buffer_nbytes = self.tensor_total(buffers)
        nbytes = self.tensor_total(params) + buffer_nbytes
        self.largest_block = max(self.largest_block, nbytes)
        stats = self.cache[id(block)] = Stats(nbytes, buffer_nbytes, count, nbytes)
        return stats

    def tensor_total(self, tensors: list[torch.Tensor | None]) -> int:
        """Bytes of ``tensors`` under the planning dtype, empty slots skipped."""
        present = list(filter(_NOT_NONE, tensors))
        if not present:
            return 0
        if self.tensor_ids is not None:
            self.tensor_ids += map(id, present)
        dtypes = list(map(_GET_DTYPE, present))
        kinds = set(dtypes)
        itemsizes = self.itemsizes
        for dtype in kinds - itemsizes.keys():
            itemsizes[dtype] = self.itemsize_for(dtype)
        if len(kinds) == 1 and isinstance(itemsizes[dtypes[0]], int):
            return sum(map(_NUMEL, present)) * itemsizes[dtypes[0]]
        return sum(self._nbytes(present))

    # -- subtrees -----------------------------------------------------------------------------

    def read(self, roots: list[nn.Module]) -> list[Stats]:
        """Stats of each root's subtree. They, and those of the modules down to ``_CACHED_DEPTH``
        levels below the roots, go to ``cache`` (so do those of every block met)."""
        # One group per depth: the modules at that depth and where each one's subtree lies in
        # the current level (bounds); nbytes, buffer bytes, modules, largest layer of each.
        groups: list[tuple[list[nn.Module], list[int], list[list[int]]]] = []
        level = roots
        while level:
            if len(groups) <= _CACHED_DEPTH:
                totals = [[0] * len(level) for _ in range(4)]
                groups.append((level, list(range(len(level) + 1)), totals))
            node_stats, child_counts, next_level = self._level_stats(level)
            prefixes = [_prefix(values) for values in node_stats[:3]]
            counts = _prefix(child_counts)
            for position, (modules, bounds, totals) in enumerate(groups):
                for values, prefix in zip(totals, prefixes, strict=False):
                    values[:] = map(add, values, _range_sums(prefix, bounds))
                totals[3][:] = map(max, totals[3], _range_maxima(node_stats[3], bounds))
                groups[position] = (modules, list(map(counts.__getitem__, bounds)), totals)
            level = next_level
        for modules, _, totals in groups:
            self.cache.update(
                zip(map(id, modules), map(Stats._make, zip(*totals, strict=True)), strict=True)
            )
        return [self.cache[id(root)] for root in roots]

    def _level_stats(
        self, level: list[nn.Module]
    ) -> tuple[list[list[int]], list[int], list[nn.Module]]:
        """Per module of one level: bytes, buffer bytes, module count, layer bytes; then each
        one's number of children looked into and the next level.

        Works in chunks that stay in the CPU cache: a module, its dicts and its tensors are
        fetched from memory once for all the passes over them. Blocks count whole and their
        children are left out of the next level.
        """
        nbytes: list[int] = []
        buffers: list[int] = []
        counts: list[int] = []
        child_counts: list[int] = []
        next_level: list[nn.Module] = []
        for start in range(0, len(level), _CHUNK):
            chunk = level[start : start + _CHUNK]
            try:
                child_dicts, param_dicts, buffer_dicts = zip(*map(_GET_DICTS, chunk), strict=True)
            except AttributeError:  # None in a module slot
                raise Refused from None
            if self.module_ids is not None:
                self.module_ids += map(id, chunk)
            chunk_buffers = self.own_nbytes(buffer_dicts)
            chunk_nbytes = list(map(add, self.own_nbytes(param_dicts), chunk_buffers))
            chunk_counts = [1] * len(chunk)
            if self.blocks:
                flags = list(map(self._is_block, map(type, chunk)))
                if any(flags):
                    child_dicts = list(child_dicts)
                    for position in compress(range(len(chunk)), flags):
                        stats = self.block_stats(chunk[position])
                        chunk_nbytes[position], chunk_buffers[position] = stats[:2]
                        chunk_counts[position] = stats.count
                        child_dicts[position] = {}
            nbytes += chunk_nbytes
            buffers += chunk_buffers
            counts += chunk_counts
            child_counts += map(len, child_dicts)
            next_level += chain.from_iterable(map(dict.values, child_dicts))
        layers = list(map(mul, nbytes, map(not_, child_counts)))
        return [nbytes, buffers, counts, layers], child_counts, next_level

    def leaf_stats(self, model: nn.Module) -> tuple[int, int]:
        """``(count, total bytes)`` of the modules without children holding bytes, root
        excluded, blocks looked into."""
        blocks, self.blocks = self.blocks, frozenset()
        try:
            count = total = 0
            level = list(_GET_MODULES(model).values())
            while level:
                child_dicts, param_dicts, buffer_dicts = zip(*map(_GET_DICTS, level), strict=True)
                nbytes = map(add, self.own_nbytes(param_dicts), self.own_nbytes(buffer_dicts))
                leaves = list(filter(None, compress(nbytes, map(not_, map(len, child_dicts)))))
                count += len(leaves)
                total += sum(leaves)
                level = list(chain.from_iterable(map(dict.values, child_dicts)))
            return count, total
        finally:
            self.blocks = blocks
