"""The one ring buffer: contiguous views across wraps, widening, and its users in the plots."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.runtime.ring_buffer import RingBuffer


@pytest.mark.parametrize("appended", [0, 1, 4, 5, 7, 8, 9, 23, 100])
def test_view_is_the_newest_rows_in_order_at_every_fill_level(appended: int) -> None:
    buf = RingBuffer(4, width=2)
    for i in range(appended):
        buf.append((i, -i))
    expected = list(range(max(0, appended - 4), appended))
    view = buf.view()
    assert view[:, 0].tolist() == expected and view[:, 1].tolist() == [-i for i in expected]
    assert buf.snapshot().tolist() == view.tolist()
    if appended:
        assert np.shares_memory(view, buf.view())  # no copy
        assert not np.shares_memory(buf.snapshot(), view)
    assert buf.snapshot(last=2).tolist() == view[-2:].tolist()
    assert len(buf) == len(expected) and buf.total_appended == appended


def test_storage_never_grows_with_run_length() -> None:
    buf = RingBuffer(5, width=3)
    nbytes = buf.nbytes
    for i in range(10_000):
        buf.append((i, i, i))
    assert buf.nbytes == nbytes == 2 * 5 * 3 * 8
    assert buf.view()[:, 0].tolist() == [9995, 9996, 9997, 9998, 9999]


def test_widen_adds_columns_with_the_fill_for_earlier_rows() -> None:
    buf = RingBuffer(3, width=1)
    for i in range(5):
        buf.append(i)
    buf.widen(2)
    assert buf.width == 3
    buf.append((5, 50, 500))
    rows = buf.snapshot()
    assert rows[:, 0].tolist() == [3, 4, 5]
    assert np.isnan(rows[:2, 1:]).all() and rows[2, 1:].tolist() == [50, 500]
    buf.widen(1, fill=0.0)
    assert buf.latest().tolist() == [5, 50, 500, 0]
    with pytest.raises(ValueError, match="columns must be >= 1"):
        buf.widen(0)


def test_clear_keeps_counting_appends() -> None:
    buf = RingBuffer(2)
    buf.extend([(1.0,), (2.0,), (3.0,)])
    buf.clear()
    assert len(buf) == 0 and buf.latest() is None and buf.view().shape == (0, 1)
    buf.append(4.0)
    assert buf.snapshot().tolist() == [[4.0]] and buf.total_appended == 4


def test_capacity_one_keeps_only_the_newest_row() -> None:
    buf = RingBuffer(1, width=1)
    for i in range(5):
        buf.append(i)
        assert buf.view().tolist() == [[i]]
