"""The layer partition of a pipeline: consecutive layers per stage, the slowest stage as fast
as it can be, every stage within its memory budget.

Binary search on the slowest stage's time: for a given time limit, which layer boundaries each
stage can reach (within the limit and its own budget) decides whether any partition exists, so
the smallest feasible limit is found in 60 halvings; ``_even_out`` then hands layers back from
the front stages so the last stages are not left with a remainder.
"""

from __future__ import annotations

import bisect
import itertools


def partition_layers(
    n: int,
    layer_mem: list[int],
    layer_time: list[list[float]],
    fixed_mem: list[int],
    fixed_time: list[float],
    budgets: list[int] | None,
) -> list[int] | None:
    """Layer counts per stage minimising the slowest stage, every stage within its budget.

    Args:
        n: layers to place, in order.
        layer_mem: bytes layer ``i`` costs a device (weights / tp + its KV cache).
        layer_time: ``layer_time[s][i]``, seconds layer ``i`` takes on stage ``s``'s GPUs.
        fixed_mem: bytes stage ``s`` holds besides its layers (embeddings, head, overhead).
        fixed_time: seconds stage ``s`` spends besides its layers (the head's matmul).
        budgets: bytes each stage may use; ``None`` balances time alone.

    Returns:
        One count per stage (each at least 1, summing to ``n``), or ``None`` when no
        partition fits the budgets.

    Example:
        >>> partition_layers(4, [1] * 4, [[1.0] * 4] * 2, [0, 0], [0.0, 1.0], [10, 10])
        [3, 1]
    """
    pp = len(fixed_mem)
    if n < pp:
        return None
    mem_prefix = list(itertools.accumulate(layer_mem, initial=0))
    time_prefix = [list(itertools.accumulate(row[:n], initial=0.0)) for row in layer_time]

    def last_end(s: int, start: int, limit_s: float) -> int:
        """The furthest layer stage ``s`` can run up to (exclusive) from ``start``."""
        end = n
        if budgets is not None:
            room = budgets[s] - fixed_mem[s] + mem_prefix[start]
            end = min(end, bisect.bisect_right(mem_prefix, room) - 1)
        room_s = limit_s - fixed_time[s] + time_prefix[s][start]
        return min(end, bisect.bisect_right(time_prefix[s], room_s) - 1)

    def feasible(limit_s: float) -> list[int] | None:
        """A partition within ``limit_s`` and the budgets, front stages as full as they can
        be (``_even_out`` then hands layers back), or ``None``. Reachability over stage
        boundaries, not a greedy fill: with unequal budgets, filling the first stages can
        push a large layer onto a small GPU while another split fits."""
        reach = [[False] * (n + 1) for _ in range(pp + 1)]
        reach[0][0] = True
        for s in range(pp):
            marks = [0] * (n + 2)
            for start in range(n):
                if reach[s][start]:
                    end = last_end(s, start, limit_s)
                    if end > start:
                        marks[start + 1] += 1
                        marks[end + 1] -= 1
            running = 0
            for i in range(n + 1):
                running += marks[i]
                reach[s + 1][i] = running > 0
        if not reach[pp][n]:
            return None
        counts, end = [], n
        for s in range(pp - 1, -1, -1):
            start = max(j for j in range(end) if reach[s][j] and last_end(s, j, limit_s) >= end)
            counts.append(end - start)
            end = start
        return counts[::-1]

    high = max(fixed_time) + sum(max(row[i] for row in layer_time) for i in range(n)) + 1.0
    if feasible(high) is None:
        return None
    low = 0.0
    for _ in range(60):
        middle = (low + high) / 2
        if feasible(middle) is None:
            low = middle
        else:
            high = middle
    return _even_out(feasible(high), layer_mem, layer_time, fixed_mem, fixed_time, budgets, high)


def _even_out(
    counts: list[int] | None,
    layer_mem: list[int],
    layer_time: list[list[float]],
    fixed_mem: list[int],
    fixed_time: list[float],
    budgets: list[int] | None,
    limit_s: float,
) -> list[int] | None:
    """The greedy partition at the optimal time fills the first stages and leaves the last
    with the rest (``8,9,...,9,1``); shift layers back so each stage holds about its share of
    what is left, never past ``limit_s`` or a budget."""
    if counts is None:
        return None
    counts = list(counts)
    for _ in range(sum(counts)):
        moved = False
        for s in range(len(counts) - 1, 0, -1):
            while counts[s - 1] > 1:
                first_next = sum(counts[:s]) - 1  # the layer that would move to stage s
                times = [
                    fixed_time[t] + sum(layer_time[t][i] for i in _span(counts, t))
                    for t in (s - 1, s)
                ]
                moved_time = layer_time[s][first_next]
                if times[1] + moved_time >= times[0]:
                    break
                if times[1] + moved_time > limit_s:
                    break
                if budgets is not None:
                    mem = fixed_mem[s] + sum(layer_mem[i] for i in _span(counts, s))
                    if mem + layer_mem[first_next] > budgets[s]:
                        break
                counts[s - 1] -= 1
                counts[s] += 1
                moved = True
        if not moved:
            break
    return counts


def _span(counts: list[int], s: int) -> range:
    start = sum(counts[:s])
    return range(start, start + counts[s])
