"""Unsaved changes: "dirty" means changed since the model was opened or saved, the title's "*"
follows undo, and closing or replacing unsaved work asks Save / Discard / Cancel."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from PySide6.QtWidgets import QApplication, QFileDialog, QMessageBox

from workbench.gui import settings as app_settings
from workbench.gui.commands import push_plan
from workbench.gui.tree_model import modules_mime_data

pytestmark = pytest.mark.gui

Button = QMessageBox.StandardButton


def _drop(window: Any, device: Any, names: list[str]) -> None:
    assert window.lanes.lane(device).dropMimeData(modules_mime_data(names))


def _is_dirty(window: Any) -> bool:
    """The session's flag, checked against the title's "*" so the two never disagree."""
    assert window.windowTitle().startswith("tiny-lm")
    assert (" * " in window.windowTitle()) == window.session.dirty
    return window.session.dirty


def _prompts() -> list[QMessageBox]:
    return [
        w for w in QApplication.topLevelWidgets() if isinstance(w, QMessageBox) and w.isVisible()
    ]


def _answer(qtbot: Any, button: QMessageBox.StandardButton) -> QMessageBox:
    """Wait for the "Save changes…?" box and click ``button`` on it, as a user would."""
    qtbot.waitUntil(lambda: len(_prompts()) == 1, timeout=5000)
    box = _prompts()[0]
    assert box.text() == "Save changes to the session for tiny-lm?"
    box.button(button).click()
    return box


def test_set_opened_is_clean_and_the_star_follows_undo(tiny_window) -> None:
    window = tiny_window
    stack = window.undo_stack
    assert not _is_dirty(window) and stack.isClean()
    _drop(window, 0, ["embed"])
    assert _is_dirty(window)
    stack.undo()  # back to <opened>
    assert not _is_dirty(window)
    stack.redo()
    assert _is_dirty(window)
    stack.undo()
    assert not _is_dirty(window)


def test_budget_edit_hardware_switch_and_plan_apply_each_make_it_dirty(
    tiny_window, test_profile
) -> None:
    window = tiny_window
    budgets = {**window.session.budgets, 0: 1024**3}
    window.budget_editor.budgets_edited.emit(budgets)
    assert window.session.budgets[0] == 1024**3 and _is_dirty(window)
    window.undo_stack.undo()
    assert not _is_dirty(window)

    other = dataclasses.replace(test_profile, name="test-other")
    window.set_hardware_profile(other)
    assert window.session.profile.name == "test-other" and _is_dirty(window)
    window.undo_stack.undo()
    assert not _is_dirty(window)

    push_plan(window.undo_stack, window.session, {"": 0}, strategy="balanced")
    assert window.session.device_map == {"": 0} and _is_dirty(window)
    window.undo_stack.undo()
    assert not _is_dirty(window)


def test_saving_is_the_new_clean_state(tiny_window, tmp_path, monkeypatch) -> None:
    window = tiny_window
    target = tmp_path / "saved.json"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(target), ""))
    _drop(window, 0, ["embed"])
    window.actions_by_name["save_session"].trigger()
    assert target.is_file() and not _is_dirty(window)
    window.undo_stack.undo()  # the saved state has embed on cuda:0
    assert _is_dirty(window)
    window.undo_stack.redo()
    assert not _is_dirty(window)


def test_closing_clean_work_does_not_ask(tiny_window) -> None:
    window = tiny_window
    assert window.close()
    assert not window.isVisible() and not _prompts()


def test_close_cancel_keeps_the_window_and_the_worker(qtbot, tiny_window) -> None:
    window = tiny_window
    timer = window.runtime_panels.memory_plot.timer
    assert timer.isActive()
    _drop(window, 0, ["embed"])
    assert not window.close()  # waits for the answer
    _answer(qtbot, Button.Cancel)
    assert window.isVisible() and _is_dirty(window)
    assert timer.isActive()  # the runtime panels did not shut down for a cancelled close
    assert window.session.device_map["embed"] == 0


def test_close_discard_closes_and_removes_the_autosave(qtbot, tiny_window) -> None:
    window = tiny_window
    _drop(window, 0, ["embed"])
    window.autosave_now()
    assert app_settings.pending_autosave() is not None
    window.close()
    _answer(qtbot, Button.Discard)
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=5000)
    assert app_settings.pending_autosave() is None


def test_close_save_writes_the_session_then_closes(
    qtbot, tiny_window, tmp_path, monkeypatch
) -> None:
    window = tiny_window
    target = tmp_path / "on-close.json"
    answers = iter([("", ""), (str(target), "")])  # the first save dialog is cancelled
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: next(answers))
    _drop(window, 0, ["embed"])
    window.close()
    _answer(qtbot, Button.Save)
    assert window.isVisible() and not target.exists()  # no file chosen: nothing is lost
    window.close()
    _answer(qtbot, Button.Save)
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=5000)
    saved = json.loads(target.read_text(encoding="utf-8"))
    assert saved["source"] == "tiny-lm"
    assert saved["device_map"]["embed"] == 0


@pytest.mark.slow  # opens a what-if config with transformers on a worker thread
def test_open_another_model_asks_first_and_opens_clean(
    qtbot, tiny_window, whatif_config, open_in_window
) -> None:
    window = tiny_window
    _drop(window, 0, ["embed"])
    window.open_replacing(str(whatif_config))
    _answer(qtbot, Button.Cancel)
    assert window.open_thread is None and window.session.source == "tiny-lm"

    window.open_replacing(str(whatif_config))
    _answer(qtbot, Button.Discard)
    assert window.open_thread is not None
    qtbot.waitUntil(lambda: window.session.source == str(whatif_config), timeout=60_000)
    qtbot.waitUntil(lambda: not window.open_thread.isRunning(), timeout=60_000)
    assert not window.session.dirty and window.undo_stack.isClean()
    assert window.windowTitle() == "tiny-llama-demo — Model Memory Workbench"


@pytest.mark.slow  # opens a what-if config with transformers on a worker thread
def test_restoring_a_session_is_clean(qtbot, main_window, whatif_config, tmp_path) -> None:
    from workbench.runtime.session import Session

    path = tmp_path / "saved.json"
    Session(source=str(whatif_config), device_map={"": "cpu"}).save(path)
    window = main_window
    thread = window.restore_session_file(path)
    assert thread is not None
    qtbot.waitUntil(lambda: window.session.tree is not None or bool(window.errors), timeout=60_000)
    qtbot.waitUntil(lambda: not thread.isRunning(), timeout=5000)
    assert not window.errors, window.errors
    assert window.session.device_map == {"": "cpu"}
    assert not window.session.dirty and " * " not in window.windowTitle()
