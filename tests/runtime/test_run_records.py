"""Run records: a short stable id per device map, a summary, and what differs between two."""

from __future__ import annotations

from workbench.runtime.run_records import map_diff, map_digest, map_summary


def test_map_helpers() -> None:
    assert map_summary({"a": 0, "b": 0, "c": "disk"}) == "cuda:0 2 · disk 1"
    assert map_diff({"a": 0, "b": "cpu"}, {"a": 0, "b": "disk", "c": "cpu"}) == [
        "b: cpu -> disk",
        "c: - -> cpu",
    ]
    assert map_digest({"b": 1, "a": 0}) == map_digest({"a": 0, "b": 1})
