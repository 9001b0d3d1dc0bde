"""A fixed-capacity ring buffer of float rows: memory never grows with run length.

Example:
    >>> buf = RingBuffer(3, width=2)
    >>> for i in range(5):
    ...     buf.append((i, 10 * i))
    >>> buf.snapshot().tolist()
    [[2.0, 20.0], [3.0, 30.0], [4.0, 40.0]]
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np


class RingBuffer:
    """A fixed-capacity FIFO of float rows in one preallocated numpy array (thread-safe).

    Args:
        capacity: the most rows kept; older rows are overwritten.
        width: values per row.
        dtype: numpy dtype of the storage (float64 holds byte counts exactly up to 2**53).
    """

    def __init__(self, capacity: int, width: int = 1, dtype: np.dtype | str = "float64") -> None:
        if capacity < 1 or width < 1:
            raise ValueError(f"capacity and width must be >= 1, got {capacity} and {width}")
        self._data = np.zeros((capacity, width), dtype=dtype)
        self._capacity = capacity
        self._next = 0
        self._count = 0
        self._total = 0
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def width(self) -> int:
        return self._data.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes held by the storage (constant for the buffer's life)."""
        return int(self._data.nbytes)

    @property
    def total_appended(self) -> int:
        """Rows ever appended (keeps counting after the buffer wraps)."""
        return self._total

    def __len__(self) -> int:
        return self._count

    def append(self, row: Sequence[float] | float) -> None:
        """Append one row (a scalar is accepted when ``width`` is 1)."""
        with self._lock:
            self._data[self._next] = row
            self._next = (self._next + 1) % self._capacity
            self._count = min(self._count + 1, self._capacity)
            self._total += 1

    def extend(self, rows: Iterable[Sequence[float]]) -> None:
        for row in rows:
            self.append(row)

    def clear(self) -> None:
        with self._lock:
            self._next = self._count = 0

    def snapshot(self, last: int | None = None) -> np.ndarray:
        """Return a copy of the rows, oldest first (at most ``last`` of the newest)."""
        with self._lock:
            count = self._count if last is None else min(last, self._count)
            start = (self._next - count) % self._capacity
            if start + count <= self._capacity:
                return self._data[start : start + count].copy()
            head = self._data[start:]
            return np.concatenate([head, self._data[: count - len(head)]])

    def latest(self) -> np.ndarray | None:
        """Return the newest row, or ``None`` when empty."""
        with self._lock:
            if self._count == 0:
                return None
            return self._data[(self._next - 1) % self._capacity].copy()
