"""The app's one fixed-capacity ring buffer of float rows: memory never grows with run length.

The telemetry histories (memory samples, transfer events) and the GUI's plots (memory series,
the transfer heatmap) all keep their recent rows in one of these.

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

    Storage holds ``2 * capacity`` rows; when it fills, the newest ``capacity - 1`` rows move to
    the front (amortised O(1) per row), so the kept rows are always one contiguous slice:
    ``view()`` returns it without a copy, ``snapshot()`` copies it.

    Args:
        capacity: the most rows kept; older rows are dropped.
        width: values per row; ``widen`` adds columns later.
        dtype: numpy dtype of the storage (float64 holds byte counts exactly up to 2**53).
    """

    def __init__(self, capacity: int, width: int = 1, dtype: np.dtype | str = "float64") -> None:
        if capacity < 1 or width < 1:
            raise ValueError(f"capacity and width must be >= 1, got {capacity} and {width}")
        self._data = np.zeros((2 * capacity, width), dtype=dtype)
        self._capacity = capacity
        self._start = 0
        self._end = 0
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
        """Bytes held by the storage (constant for the buffer's life unless it is widened)."""
        return int(self._data.nbytes)

    @property
    def total_appended(self) -> int:
        """Rows ever appended (keeps counting after the buffer wraps or is cleared)."""
        return self._total

    def __len__(self) -> int:
        return self._end - self._start

    def append(self, row: Sequence[float] | np.ndarray | float) -> None:
        """Append one row (a scalar is accepted when ``width`` is 1)."""
        with self._lock:
            if self._end == len(self._data):
                keep = self._capacity - 1
                self._data[:keep] = self._data[self._end - keep : self._end]
                self._start, self._end = 0, keep
            elif self._end - self._start == self._capacity:
                self._start += 1
            self._data[self._end] = row
            self._end += 1
            self._total += 1

    def extend(self, rows: Iterable[Sequence[float]]) -> None:
        for row in rows:
            self.append(row)

    def widen(self, columns: int, fill: float = np.nan) -> None:
        """Add ``columns`` columns on the right; the rows already kept read ``fill`` there.

        Example:
            >>> buf = RingBuffer(2)
            >>> buf.append(1.0)
            >>> buf.widen(1)
            >>> buf.snapshot().tolist()
            [[1.0, nan]]
        """
        if columns < 1:
            raise ValueError(f"columns must be >= 1, got {columns}")
        with self._lock:
            extra = np.full((len(self._data), columns), fill, dtype=self._data.dtype)
            self._data = np.hstack([self._data, extra])

    def clear(self) -> None:
        with self._lock:
            self._start = self._end = 0

    def view(self) -> np.ndarray:
        """The kept rows, oldest first, as a view of the storage (no copy).

        Valid until the next ``append``/``widen`` from any thread: for a single-threaded user
        (a plot on the GUI thread) that reads it right away; others use ``snapshot()``.
        """
        return self._data[self._start : self._end]

    def snapshot(self, last: int | None = None) -> np.ndarray:
        """Return a copy of the rows, oldest first (at most ``last`` of the newest)."""
        with self._lock:
            count = self._end - self._start if last is None else min(last, self._end - self._start)
            return self._data[self._end - count : self._end].copy()

    def latest(self) -> np.ndarray | None:
        """Return the newest row, or ``None`` when empty."""
        with self._lock:
            if self._end == self._start:
                return None
            return self._data[self._end - 1].copy()
