"""Every map change is one undo step; undo/redo restore the exact maps."""

from __future__ import annotations

import pytest

from workbench.gui.commands import SetDeviceMapCommand, push_plan
from workbench.gui.diff_dialog import map_at_index, show_diff_against_history
from workbench.gui.tree_model import DEVICE_COLUMN, modules_mime_data
from workbench.runtime.map_edits import diff_maps

pytestmark = pytest.mark.gui


def _drop(window, device, names) -> None:
    assert window.lanes.lane(device).dropMimeData(modules_mime_data(names))


def test_undo_and_redo_restore_each_exact_map(tiny_window) -> None:
    window = tiny_window
    stack = window.undo_stack
    maps = [dict(window.session.device_map)]
    for device, names in (
        (0, ["embed"]),
        (1, ["layers.2", "layers.3"]),
        ("disk", ["norm"]),
        (0, ["layers"]),
    ):
        _drop(window, device, names)
        maps.append(dict(window.session.device_map))
    assert stack.count() == 4
    assert [stack.text(i) for i in range(4)] == [
        "Move 'embed' to cuda:0 (with tied head)",
        "Move 2 modules to cuda:1",
        "Move 'norm' to disk",
        "Move 'layers' to cuda:0",
    ]
    for expected in reversed(maps[:-1]):
        stack.undo()
        assert window.session.device_map == expected
    assert window.session.device_map == {"": "cpu"}
    for expected in maps[1:]:
        stack.redo()
        assert window.session.device_map == expected
    # the tree's device column follows undo
    stack.undo()
    assert window.tree_model.index_of("layers", DEVICE_COLUMN).data() == "mixed"


def test_applying_a_plan_is_one_macro_with_budgets(tiny_window) -> None:
    window = tiny_window
    before_map, before_budgets = dict(window.session.device_map), dict(window.session.budgets)
    plan_map = {"embed": 0, "head": 0, "layers": 1, "norm": "cpu"}
    push_plan(
        window.undo_stack,
        window.session,
        plan_map,
        strategy="balanced",
        budgets={0: 1000, 1: 5000, "cpu": 10_000, "disk": 10**9},
        reserve=64,
    )
    assert window.session.device_map == plan_map
    assert window.session.reserve == 64
    assert window.undo_stack.count() == 1
    assert window.undo_stack.undoText() == "Apply balanced plan"
    window.undo_stack.undo()
    assert window.session.device_map == before_map
    assert window.session.budgets == before_budgets
    assert window.session.reserve == 0


def test_map_at_earlier_state_and_diff(tiny_window) -> None:
    window = tiny_window
    _drop(window, 0, ["layers.0"])
    _drop(window, 1, ["layers.1"])
    stack = window.undo_stack
    assert map_at_index(stack, window.session.device_map, 0) == {"": "cpu"}
    assert map_at_index(stack, window.session.device_map, 1)["layers.0"] == 0
    diff = diff_maps(window.session.tree, {"": "cpu"}, dict(window.session.device_map))
    assert diff.moved == [("layers.0", "cpu", 0), ("layers.1", "cpu", 1)]
    assert diff.bytes_before == {"cpu": 2848}  # 512 + 4 x 576 + 32
    assert diff.bytes_after == {0: 576, 1: 576, "cpu": 2848 - 2 * 576}
    dialog = show_diff_against_history(window, 0)
    assert (
        dialog is not None
        and "2</b> module(s) changed" in dialog.findChildren(type(window.speed_label))[0].text()
    )
    assert "before:" in dialog.speed_label.text() and "after:" in dialog.speed_label.text()
    dialog.close()


def test_command_keeps_its_own_copies(tiny_window) -> None:
    window = tiny_window
    new_map = {"": 0}
    command = SetDeviceMapCommand(window.session, new_map, "All on cuda:0")
    new_map[""] = "cpu"  # the caller mutating its dict must not change the command
    window.undo_stack.push(command)
    assert window.session.device_map == {"": 0}
    assert command.before == {"": "cpu"}
