"""Issue 14 item 13: "Open config or folder" opens a model folder as well as a config file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox, QLineEdit

from workbench.gui.open_dialog import OpenModelDialog, is_model_folder

pytestmark = pytest.mark.gui


def _open_dialog(window: Any, qtbot: Any) -> OpenModelDialog:
    window.actions_by_name["open_config"].trigger()
    qtbot.waitUntil(lambda: window.findChild(OpenModelDialog) is not None, timeout=5000)
    dialog = window.findChild(OpenModelDialog)
    qtbot.waitUntil(dialog.isVisible, timeout=5000)
    return dialog


def _type_and_enter(dialog: OpenModelDialog, qtbot: Any, text: str) -> None:
    edit = dialog.findChild(QLineEdit, "fileNameEdit")
    edit.clear()
    qtbot.keyClicks(edit, text)
    qtbot.keyClick(edit, Qt.Key.Key_Return)


def test_the_toolbar_open_dialog_opens_a_model_folder(
    main_window: Any, qtbot: Any, demo_dir: Path
) -> None:
    dialog = _open_dialog(main_window, qtbot)
    dialog.setDirectory(str(demo_dir.parent))
    _type_and_enter(dialog, qtbot, demo_dir.name)  # as a user types a folder's name: go in
    qtbot.waitUntil(lambda: dialog.shown_folder == demo_dir, timeout=5000)
    assert dialog.isVisible()  # a folder is entered, not opened, by Open / Enter
    button = dialog.folder_button
    assert button.text() == f"Open folder “{demo_dir.name}”" and button.font().bold()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert not dialog.isVisible() and dialog.chosen_path == demo_dir
    qtbot.waitUntil(lambda: main_window.session.tree is not None, timeout=60_000)
    assert Path(main_window.session.source) == demo_dir


def test_the_same_dialog_still_opens_a_config_file(
    main_window: Any, qtbot: Any, demo_dir: Path
) -> None:
    dialog = _open_dialog(main_window, qtbot)
    dialog.setDirectory(str(demo_dir))
    edit = dialog.findChild(QLineEdit, "fileNameEdit")
    qtbot.keyClicks(edit, "config.json")
    open_button = dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Open)
    qtbot.waitUntil(open_button.isEnabled, timeout=5000)
    qtbot.mouseClick(open_button, Qt.MouseButton.LeftButton)
    assert dialog.chosen_path == demo_dir / "config.json"
    qtbot.waitUntil(lambda: main_window.session.tree is not None, timeout=60_000)


def test_is_model_folder(tmp_path: Path, demo_dir: Path) -> None:
    assert is_model_folder(demo_dir)
    assert not is_model_folder(tmp_path)  # empty
    assert not is_model_folder(demo_dir / "config.json")  # a file
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    assert is_model_folder(tmp_path)
