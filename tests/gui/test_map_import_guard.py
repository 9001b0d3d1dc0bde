"""Importing a wrapped map checks its model record; import and diff dialogs never pile up.

Issue 14 items 7 and 15: a map made for a 10.3M model imported into the 60M demo as "valid for
this model"; import dialogs were non-modal, piled up, and one was still open during a load.
"""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox

from workbench.big_modeling.device_map.files import save_device_map
from workbench.gui import diff_dialog, map_io

pytestmark = pytest.mark.gui


def _ok(dialog: map_io.ImportDialog):
    return dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)


def test_a_map_made_for_another_model_needs_an_explicit_choice(tiny_window, tmp_path) -> None:
    window = tiny_window
    path = tmp_path / "gpt2.json"
    save_device_map(path, {"": 1}, **{"class": "GPT2LMHeadModel", "param_count": 124_439_808})
    dialog = map_io.import_device_map(window, path)
    assert dialog is not None and dialog.problems == []  # the entries themselves fit
    assert dialog.record_differences == [
        "class: the map was made for GPT2LMHeadModel, this model is TinyLM",
        f"param_count: the map was made for 124,439,808 parameters, this model has "
        f"{window.session.tree.root.param_count:,}",
    ]
    assert (
        "made for another model" in dialog.message
        and "valid for this model" not in (dialog.message.split("\n", 1)[0])
    )
    assert dialog.use_plain_map.isVisibleTo(dialog) and not _ok(dialog).isEnabled()
    _ok(dialog).click()  # disabled: nothing happens
    dialog.accept()  # nor when called directly
    assert window.session.device_map == {"": "cpu"}
    dialog.use_plain_map.click()  # the explicit choice
    assert _ok(dialog).isEnabled()
    _ok(dialog).click()
    assert window.session.device_map == {"": 1}


def test_a_map_exported_for_this_model_imports_without_questions(tiny_window, tmp_path) -> None:
    window = tiny_window
    path = map_io.export_device_map(window, tmp_path / "mine.json", wrapped=True)
    assert json.loads(path.read_text())["model"]["class"] == "TinyLM"
    dialog = map_io.import_device_map(window, path)
    assert dialog is not None and dialog.record_differences == []
    assert not dialog.use_plain_map.isVisibleTo(dialog) and _ok(dialog).isEnabled()
    dialog.reject()


def test_import_dialogs_are_modal_and_do_not_pile_up(tiny_window, tmp_path) -> None:
    window = tiny_window
    paths = []
    for name in ("a", "b", "c"):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps({"": "cpu"}))
    dialogs = [map_io.import_device_map(window, path) for path in paths]
    visible = [d for d in window.findChildren(map_io.ImportDialog) if d.isVisible()]
    assert visible == [dialogs[-1]]
    assert dialogs[-1].windowModality() == Qt.WindowModality.WindowModal
    dialogs[-1].reject()


def test_diff_dialogs_are_modal_and_do_not_pile_up(tiny_window) -> None:
    window = tiny_window
    first = diff_dialog.show_diff(window, {"": 0}, "first")
    second = diff_dialog.show_diff(window, {"": 1}, "second")
    visible = [d for d in window.findChildren(diff_dialog.DiffDialog) if d.isVisible()]
    assert first is not None and visible == [second]
    assert second.windowModality() == Qt.WindowModality.WindowModal
    second.close()
