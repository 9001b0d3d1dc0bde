"""The diff dialog against a map with unknown keys and uncovered modules: it names them, keeps
a readable width, wraps and cuts long messages, and closes from its Close button."""

from __future__ import annotations

import json

import pytest
from PySide6.QtWidgets import QDialogButtonBox

from workbench.gui.diff_dialog import MESSAGE_CHARS, show_diff_against_file

pytestmark = pytest.mark.gui


def _table_texts(table, column: int) -> list[str]:
    return [table.item(row, column).text() for row in range(table.rowCount())]


def test_diff_names_unknown_keys_and_uncovered_modules(qtbot, tiny_window, tmp_path) -> None:
    window = tiny_window
    path = tmp_path / "a_rather_long_name_for_an_exported_device_map.json"
    path.write_text(json.dumps({"embed": 0, "layers.0": 0, "bogus_layer": "disk"}))
    dialog = show_diff_against_file(window, str(path))
    assert dialog is not None and not window.errors
    qtbot.waitExposed(dialog)
    label = path.name
    assert dialog.problems == [
        f"{label} names 1 module(s) not in the model: bogus_layer",
        f"{label} gives no device to layers.1-3, norm, head",
    ]
    assert dialog.problems_label.isVisible()
    assert "bogus_layer" in dialog.problems_label.text()
    modules = _table_texts(dialog.moved_table, 0)
    row = modules.index("bogus_layer (not in the model)")
    assert dialog.moved_table.item(row, 1).text() == "disk"
    assert dialog.moved_table.item(row, 2).text() == "—"  # not "uncovered": it names nothing
    assert modules == ["embed", "layers.0", "bogus_layer (not in the model)"]
    header = dialog.totals_table.horizontalHeader()
    header_text = dialog.totals_table.horizontalHeaderItem(0).text()
    assert header_text.startswith("…") and header_text.endswith(".json")
    assert dialog.totals_table.horizontalHeaderItem(0).toolTip() == label
    needed = header.fontMetrics().horizontalAdvance(header_text)
    assert header.sectionSize(0) >= needed  # the column header is not clipped
    assert dialog.width() <= 720
    assert dialog.speed_label.wordWrap()
    with qtbot.waitSignal(dialog.destroyed, timeout=5_000):
        dialog.buttons.button(QDialogButtonBox.StandardButton.Close).click()


def test_a_map_that_covers_nothing_gets_a_short_speed_line(qtbot, tiny_window, tmp_path) -> None:
    path = tmp_path / "nothing.json"
    path.write_text(json.dumps({"bogus": 0}))
    dialog = show_diff_against_file(tiny_window, str(path))
    assert dialog is not None
    full = dialog.speed_label.toolTip()
    assert "device map gives no device for" in full and len(full) > MESSAGE_CHARS
    shown = dialog.speed_label.text()
    assert shown.endswith(" …") and len(shown) <= MESSAGE_CHARS + 2
    assert full.startswith(shown[:-2])
    dialog.close()
