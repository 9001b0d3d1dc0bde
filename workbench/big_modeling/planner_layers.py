"""The largest layer still to place, as a max segment tree over layers in preorder.

The planner keeps room on its main devices for the largest layer it has not placed yet. Layers
are placed in preorder, so "not placed yet" is "at this preorder position or later" — a suffix
maximum — except for the few modules placed early (a tied partner, a fallback), which are
removed from the tree. Queries and removals are O(log n).
"""

from __future__ import annotations

from bisect import bisect_left


class SuffixMax:
    """Max of layer sizes from a position on, with removal of single layers (segment tree)."""

    def __init__(self, positions: list[int], sizes: list[int]) -> None:
        self.positions = positions
        count = max(1, len(positions))
        self.width = width = 1 << (count - 1).bit_length()
        # Built level by level with C-level map(max, ...): node i of a level is the max of
        # nodes 2i and 2i+1 of the level below; the root level ends up at index 1.
        level = [*sizes, *[0] * (width - len(sizes))]
        levels = [level]
        while len(level) > 1:
            level = list(map(max, level[0::2], level[1::2]))
            levels.append(level)
        tree = [0]
        for level in reversed(levels):
            tree += level
        self.tree = tree

    def query_from(self, position: int) -> int:
        """Largest layer at preorder ``position`` or later."""
        low = bisect_left(self.positions, position) + self.width
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

    def remove_range(self, start: int, end: int) -> None:
        """Forget the layers with preorder positions in ``[start, end)``."""
        tree = self.tree
        for layer in range(bisect_left(self.positions, start), bisect_left(self.positions, end)):
            node = layer + self.width
            tree[node] = 0
            node >>= 1
            while node:
                tree[node] = max(tree[2 * node], tree[2 * node + 1])
                node >>= 1
