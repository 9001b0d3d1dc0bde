"""Session: change notifications, undoable edits, atomic save and restore."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.big_modeling.errors import BadInputError, DeviceMapError
from workbench.runtime.session import Session, SessionChange, SessionFileError


def test_edits_notify_and_mark_dirty() -> None:
    session = Session(source="demo")
    changes: list[SessionChange] = []
    unsubscribe = session.subscribe(changes.append)
    previous = session.set_device_map({"model": "cuda:0", "lm_head": "CPU"}, reason="plan")
    assert previous == {}
    assert session.device_map == {"model": 0, "lm_head": "cpu"}  # normalised once, here
    assert [c.what for c in changes] == ["device_map", "dirty"]
    assert changes[0].reason == "plan"
    assert session.dirty
    unsubscribe()
    session.set_budgets({"cuda:0": 1000, "cpu": 2000})
    assert len(changes) == 2  # unsubscribed: nothing more arrives
    assert session.budgets == {0: 1000, "cpu": 2000}


def test_assign_returns_previous_map_for_exact_undo() -> None:
    session = Session(
        device_map={"model.layers.0": "cpu", "model.layers.0.mlp": "disk", "lm_head": 0}
    )
    before = dict(session.device_map)
    previous = session.assign(["model.layers.0"], "disk")
    assert previous == before
    # the entry below the assigned module is folded into it
    assert session.device_map == {"model.layers.0": "disk", "lm_head": 0}
    session.set_device_map(previous, reason="undo")
    assert session.device_map == before


def test_assign_rejects_unknown_device_and_keeps_map() -> None:
    session = Session(device_map={"": "cpu"})
    with pytest.raises(DeviceMapError):
        session.assign(["model"], "gpu0")
    assert session.device_map == {"": "cpu"}


def test_a_failing_subscriber_does_not_stop_the_others() -> None:
    session = Session()
    seen: list[str] = []

    def broken(change: SessionChange) -> None:
        raise RuntimeError("view bug")

    session.subscribe(broken)
    session.subscribe(lambda change: seen.append(change.what))
    session.set_reserve(4096)
    assert seen == ["reserve", "dirty"]


def test_save_and_restore_round_trip(tmp_path: Path) -> None:
    session = Session(
        source="/models/demo",
        device_map={"model.embed_tokens": 0, "model.layers": "cpu", "lm_head": "disk"},
        budgets={0: 2**30, "cpu": 8 * 2**30},
        reserve=123,
        planner_options={"strategy": "balanced", "no_split": ["LlamaDecoderLayer"]},
        dtype="float16",
    )
    session.set_reserve(456)
    target = session.save(tmp_path / "s.workbench.json")
    assert not session.dirty
    assert [p.name for p in tmp_path.iterdir()] == ["s.workbench.json"]  # no temp file left
    restored = Session.restore(target)
    assert restored.to_dict() == session.to_dict()
    assert restored.device_map == {
        "model.embed_tokens": 0,
        "model.layers": "cpu",
        "lm_head": "disk",
    }
    assert restored.budgets == {0: 2**30, "cpu": 8 * 2**30}
    assert restored.reserve == 456
    assert not restored.dirty
    assert restored.path == target


def test_restore_names_the_file_and_problem(tmp_path: Path) -> None:
    bad_json = tmp_path / "broken.json"
    bad_json.write_text('{"format": "workbench-session", ')
    with pytest.raises(SessionFileError, match=r"broken\.json: not valid JSON \(line 1"):
        Session.restore(bad_json)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(SessionFileError, match=r"other\.json: not a workbench session"):
        Session.restore(other)
    future = tmp_path / "future.json"
    future.write_text(json.dumps({"format": "workbench-session", "version": 99}))
    with pytest.raises(BadInputError, match="version 99 is not supported"):
        Session.restore(future)
    with pytest.raises(FileNotFoundError):
        Session.restore(tmp_path / "missing.json")


def test_failed_save_keeps_the_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "s.json"
    session = Session(source="a")
    session.save(target)
    original = target.read_text()
    session.set_planner_options({"not_json": object()})
    with pytest.raises(TypeError):
        session.save()
    assert target.read_text() == original
    assert session.dirty
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]


def test_profile_survives_save_and_restore(tmp_path: Path) -> None:
    from workbench.models.hardware import DeviceSpec, HardwareProfile

    profile = HardwareProfile(
        name="what-if",
        description="one 24 GiB GPU",
        devices=(
            DeviceSpec(device=0, name="GPU", memory_bytes=24 * 2**30, compute_tflops=80.0),
            DeviceSpec(device="cpu", name="CPU", memory_bytes=64 * 2**30),
        ),
    )
    session = Session(source="x")
    assert session.set_profile(profile) is None
    restored = Session.restore(session.save(tmp_path / "s.json"))
    assert restored.profile is not None
    assert restored.profile.name == "what-if"
    assert restored.profile.budgets() == profile.budgets()
    assert restored.profile.to_dict() == profile.to_dict()


def test_assign_splits_a_covering_entry_using_the_tree(demo_dir: Path) -> None:
    from workbench.models import open_model

    session = Session(source=str(demo_dir), device_map={"": "cpu"})
    session.set_opened(open_model(demo_dir))
    previous = session.assign(["model.layers.1"], "disk")
    assert previous == {"": "cpu"}
    new_map = session.device_map
    assert new_map["model.layers.1"] == "disk"
    assert "" not in new_map
    # the split keeps every sibling on the old device, so nothing lost its placement
    assert new_map["model.layers.0"] == "cpu" and new_map["lm_head"] == "cpu"
    assert new_map["model.embed_tokens"] == "cpu" and new_map["model.norm"] == "cpu"
    from workbench.big_modeling.device_map.coverage import check_device_map

    check_device_map(session.opened.model, new_map)  # covers every tensor, no overlaps
    session.set_device_map(previous, reason="undo")
    assert session.device_map == {"": "cpu"}


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("source", 123, '"source" must be a string or null, got int 123'),
        ("device_map", ["model"], '"device_map" must be an object'),
        ("budgets", [["cpu"]], '"budgets" item 0 must be a [device, bytes] pair'),
        ("reserve", "1GiB", '"reserve" must be an integer'),
    ],
)
def test_restore_names_a_field_of_the_wrong_type(
    tmp_path: Path, field: str, value: object, expected: str
) -> None:
    path = tmp_path / "bad.json"
    document = {"format": "workbench-session", "version": 1, field: value}
    path.write_text(json.dumps(document))
    with pytest.raises(SessionFileError) as info:
        Session.restore(path)
    assert str(path) in str(info.value) and expected in str(info.value)
