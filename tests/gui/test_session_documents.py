"""Saved sessions open from every door: ``workbench PATH``, ``workbench --open PATH``,
File > Open session, a drop on the window and the recent list. Each restores the model, its
map, budgets, reserve, hardware profile and planner options, and the restored state is the
undo clean point (no "*", Ctrl+Z has nothing to undo, a move then undo is clean again).

Before the fix ``workbench --open s.json`` handed the session to the model opener, which
failed with "has no 'model_type'", and there was no File > Open session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QCoreApplication, QEvent, Qt
from PySide6.QtWidgets import QFileDialog
from user_input import drop_file

from workbench.gui import settings as app_settings
from workbench.gui.tree_model import modules_mime_data
from workbench.runtime.session import Session

pytestmark = [pytest.mark.gui, pytest.mark.slow]  # each opens a config with transformers

GIB = 1024**3
SAVED_MAP = {"model.embed_tokens": 0, "model.layers": 1, "model.norm": "cpu", "lm_head": "disk"}
SAVED_BUDGETS = {0: 3 * GIB, 1: 5 * GIB, "cpu": 7 * GIB, "disk": 100 * GIB}
SAVED_RESERVE = 123_456


@pytest.fixture
def saved_session(tmp_path: Path, whatif_config: Path, test_profile: Any) -> Path:
    """A session file as Save writes it, for the bundled tiny config on the test profile."""
    session = Session(
        source=str(whatif_config),
        device_map=SAVED_MAP,
        budgets=SAVED_BUDGETS,
        reserve=SAVED_RESERVE,
        planner_options={"strategy": "sequential"},
        profile=test_profile,
    )
    return session.save(tmp_path / "s.wbsession.json")


def assert_restored(window: Any, path: Path, whatif_config: Path) -> None:
    """The window shows the saved session, clean, with the restored state as clean point."""
    assert not getattr(window, "errors", []), window.errors
    session = window.session
    assert session.source == str(whatif_config)
    assert session.tree is not None
    assert session.device_map == SAVED_MAP
    assert session.budgets == SAVED_BUDGETS
    assert session.reserve == SAVED_RESERVE
    assert session.planner_options.get("strategy") == "sequential"
    assert window.hardware_profile().name == "test-2x24g"
    assert session.path == path
    assert not session.dirty
    assert window.windowTitle() == "tiny-llama-demo — Model Memory Workbench"
    assert window.undo_stack.isClean() and not window.undo_stack.canUndo()


def move_then_undo_is_clean(window: Any) -> None:
    """A real edit makes it dirty; undoing it returns to the restored (clean) state."""
    assert window.lanes.lane("cpu").dropMimeData(modules_mime_data(["model.embed_tokens"]))
    assert window.session.dirty and " * " in window.windowTitle()
    window.undo_stack.undo()
    assert window.session.device_map == SAVED_MAP
    assert not window.session.dirty and " * " not in window.windowTitle()


def wait_open(qtbot: Any, window: Any) -> None:
    qtbot.waitUntil(lambda: window.session.tree is not None or bool(window.errors), timeout=60_000)
    qtbot.waitUntil(lambda: not window.open_thread.isRunning(), timeout=10_000)


@pytest.mark.parametrize("form", ["workbench PATH", "workbench --open PATH"])
def test_command_line_opens_a_saved_session(
    qtbot, qapp, clean_settings, saved_session, whatif_config, test_profile, form
) -> None:
    from workbench.cli import main
    from workbench.gui.main_window import MainWindow
    from workbench.platform_integration import install_smoke_test

    argv = [str(saved_session)] if form == "workbench PATH" else ["--open", str(saved_session)]
    install_smoke_test(timeout_s=120)  # leaves exec() with 0 once a model is open
    try:
        assert main(argv) == 0
        windows = [w for w in qapp.topLevelWidgets() if isinstance(w, MainWindow)]
        shown = [w for w in windows if w.isVisible()]
        assert len(shown) == 1
        window = shown[0]
        window.errors = []
        assert_restored(window, saved_session, whatif_config)
        move_then_undo_is_clean(window)
        # sessions are listed apart from the models (File > Recent models > Sessions)
        assert app_settings.recent_models(app_settings.RECENT_SESSIONS_KEY)[0] == str(saved_session)
        assert str(saved_session) not in app_settings.recent_models()
    finally:
        for window in [w for w in qapp.topLevelWidgets() if isinstance(w, MainWindow)]:
            window.session.mark_clean()
            window.close()
            window.deleteLater()  # no closed window left for later tests to find
        qapp.setStyleSheet("")
        QCoreApplication.removePostedEvents(qapp, QEvent.Type.Quit)  # see test_main_window
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def test_file_open_session_restores_it(
    qtbot, main_window, saved_session, whatif_config, monkeypatch
) -> None:
    window = main_window
    menu_texts = [a.text() for a in window.menuBar().actions()[0].menu().actions()]
    assert "Open &session…" in menu_texts
    asked: list[str] = []

    def choose(parent, caption, folder, filters):
        asked.append(filters)
        return str(saved_session), ""

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(choose))
    window.tree_view.setFocus()
    qtbot.keyClick(
        window.tree_view,
        Qt.Key.Key_O,
        Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier,
    )
    assert asked and "*.wbsession.json" in asked[0]
    wait_open(qtbot, window)
    assert_restored(window, saved_session, whatif_config)
    move_then_undo_is_clean(window)


def test_dropping_a_session_file_restores_it(
    qtbot, main_window, saved_session, whatif_config
) -> None:
    window = main_window
    event = drop_file(window, saved_session)
    assert event.isAccepted()
    wait_open(qtbot, window)
    assert_restored(window, saved_session, whatif_config)


def test_a_session_in_the_recent_list_reopens(
    qtbot, main_window, saved_session, whatif_config
) -> None:
    window = main_window
    window.open_path(str(saved_session))
    wait_open(qtbot, window)
    window.undo_stack.clear()
    window.open_source(str(whatif_config))  # another model in between, plain
    qtbot.waitUntil(lambda: window.session.device_map != SAVED_MAP, timeout=60_000)
    qtbot.waitUntil(lambda: not window.open_thread.isRunning(), timeout=10_000)
    entries = {a.text(): a for a in window.recent_menu.actions()}
    assert str(saved_session) in entries
    entries[str(saved_session)].trigger()
    qtbot.waitUntil(lambda: window.session.device_map == SAVED_MAP, timeout=60_000)
    qtbot.waitUntil(lambda: not window.open_thread.isRunning(), timeout=10_000)
    assert_restored(window, saved_session, whatif_config)


def test_a_session_naming_a_missing_model_says_so_and_changes_nothing(
    qtbot, main_window, tmp_path
) -> None:
    window = main_window
    path = Session(source=str(tmp_path / "gone"), device_map={"": "cpu"}).save(
        tmp_path / "gone.wbsession.json"
    )
    before = dict(window.session.budgets)
    window.open_path(str(path))
    qtbot.waitUntil(lambda: bool(window.errors), timeout=60_000)
    qtbot.waitUntil(lambda: not window.open_thread.isRunning(), timeout=10_000)
    assert "gone" in window.errors[0][1]
    assert window.session.tree is None and window.session.budgets == before
    assert window.documents.pending_restore is None
