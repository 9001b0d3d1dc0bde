"""The largest layer still to place, as a max segment tree over preorder positions.

The planner keeps room on its main devices for the largest layer it has not placed yet. Layers
are placed in preorder, so "not placed yet" is "at this preorder position or later" — a suffix
maximum — except for the few modules placed early (a tied partner, a fallback), which are
removed from the tree. A lazily indexed module that is not looked into yet holds the largest
layer of its subtree at its own position; when the planner opens it, that value moves to its
children (``set``). Queries and single updates are O(log n).
"""

from __future__ import annotations

from collections.abc import Iterable


class SuffixMax:
    """Max of values from a position on, over positions ``0 .. size - 1`` (segment tree)."""

    def __init__(self, size: int, positions: Iterable[int], values: Iterable[int]) -> None:
        self.width = width = 1 << (max(1, size) - 1).bit_length()
        positions, values = list(positions), list(values)
        if len(positions) * 32 < width:  # few layers (a lazy index): set them one by one
            self.tree = [0] * (2 * width)
            for position, value in zip(positions, values, strict=True):
                self.set(position, value)
            return
        level = [0] * width
        for position, value in zip(positions, values, strict=True):
            level[position] = value
        # Built level by level with C-level map(max, ...): node i of a level is the max of
        # nodes 2i and 2i+1 of the level below; the root level ends up at index 1.
        levels = [level]
        while len(level) > 1:
            level = list(map(max, level[0::2], level[1::2]))
            levels.append(level)
        tree = [0]
        for level in reversed(levels):
            tree += level
        self.tree = tree

    def query_from(self, position: int) -> int:
        """Largest value at ``position`` or later."""
        low = position + self.width
        high = self.width + self.width
        best = 0
        tree = self.tree
        while low < high:
            if low & 1:
                best = max(best, tree[low])
                low += 1
            if high & 1:
                high -= 1
                best = max(best, tree[high])
            low >>= 1
            high >>= 1
        return best

    def set(self, position: int, value: int) -> None:
        """Make the value at ``position`` be ``value``."""
        tree = self.tree
        node = position + self.width
        if tree[node] == value:
            return
        tree[node] = value
        node >>= 1
        while node:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node >>= 1

    def remove_range(self, start: int, end: int) -> None:
        """Zero every value at positions in ``[start, end)``; costs O(log n) per nonzero one."""
        tree, width = self.tree, self.width
        stack = [(1, 0, width)]
        while stack:
            node, low, high = stack.pop()
            if high <= start or low >= end or not tree[node]:
                continue
            if high - low == 1:
                self.set(low, 0)
                continue
            middle = (low + high) // 2
            stack += ((2 * node, low, middle), (2 * node + 1, middle, high))
