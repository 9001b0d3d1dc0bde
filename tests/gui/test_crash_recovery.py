"""Crash recovery with every launch form: after a real ``kill -9`` of a real app process,
``workbench``, ``workbench --demo`` and ``workbench PATH`` all offer the autosave, and none of
them overwrites it before the user answers. A restored session counts as changed: the title has
"*", undo never reaches a clean state, and quitting asks.

Before the fix only a bare ``workbench`` offered the restore, ``--demo`` overwrote the autosave
a second after its model opened, and the restored session was clean (Ctrl+Q quit silently)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QLabel, QMessageBox, QPushButton

from workbench.gui import settings as app_settings
from workbench.gui.tree_model import modules_mime_data

pytestmark = pytest.mark.gui

DRIVER = Path(__file__).with_name("crash_driver.py")
MOVED_MAP = {"model.embed_tokens": 0, "model.layers": "disk", "model.norm": "cpu", "lm_head": "cpu"}


def autosave_of(source: Path) -> dict[str, Any]:
    return {
        "format": "workbench-session",
        "version": 1,
        "source": str(source),
        "dtype": None,
        "device_map": MOVED_MAP,
        "budgets": [[0, 1000], [1, 2000], ["cpu", 3000], ["disk", 4000]],
        "reserve": 0,
        "planner_options": {},
        "profile": None,
    }


def restore_button(bar: Any) -> QPushButton:
    return bar.findChild(QPushButton, "restoreButton")


def visible_prompts() -> list[QMessageBox]:
    return [
        w for w in QApplication.topLevelWidgets() if isinstance(w, QMessageBox) and w.isVisible()
    ]


@pytest.mark.slow  # opens a config with transformers on a worker thread
def test_a_restored_session_counts_as_changed_and_ctrl_q_asks(
    qtbot, main_window, whatif_config
) -> None:
    window = main_window
    path = app_settings.write_autosave(autosave_of(whatif_config))
    bar = window.offer_restore(path)
    assert any("tiny-llama-demo" in label.text() for label in bar.findChildren(QLabel))
    qtbot.mouseClick(restore_button(bar), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.session.tree is not None or bool(window.errors), timeout=60_000)
    qtbot.waitUntil(lambda: not window.open_thread.isRunning(), timeout=10_000)
    assert not window.errors, window.errors
    assert window.session.device_map == MOVED_MAP
    assert window.session.dirty
    assert window.windowTitle() == "tiny-llama-demo * — Model Memory Workbench"
    assert not window.undo_stack.isClean()
    # a move and its undo do not make the recovered work "saved"
    assert window.lanes.lane("cpu").dropMimeData(modules_mime_data(["model.embed_tokens"]))
    window.undo_stack.undo()
    assert window.session.dirty and " * " in window.windowTitle()
    window.tree_view.setFocus()
    qtbot.keyClick(window.tree_view, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: len(visible_prompts()) == 1, timeout=5000)
    assert visible_prompts()[0].text() == "Save changes to the session for tiny-llama-demo?"
    visible_prompts()[0].button(QMessageBox.StandardButton.Cancel).click()
    assert window.isVisible()
    assert app_settings.pending_autosave() is not None  # still protected until saved or quit


@pytest.mark.slow  # opens a config with transformers on a worker thread
def test_an_unanswered_offer_keeps_the_autosave_whatever_the_launch_opens(
    qtbot, main_window, whatif_config, open_in_window
) -> None:
    window = main_window
    path = app_settings.write_autosave(autosave_of(whatif_config))
    crashed_text = path.read_text(encoding="utf-8")
    bar = window.offer_restore(path)
    open_in_window(window, whatif_config)  # what --demo or PATH opens meanwhile
    assert window.lanes.lane("cpu").dropMimeData(modules_mime_data(["model.embed_tokens"]))
    window.autosave_now()  # what the debounce timer does a second after each change
    assert path.read_text(encoding="utf-8") == crashed_text
    assert app_settings.pending_autosave() == path
    window.session.mark_clean()
    window.close()  # a clean quit without answering: the offer comes again next time
    assert path.read_text(encoding="utf-8") == crashed_text
    assert app_settings.pending_autosave() == path
    assert not bar.isHidden()


def test_discarding_the_offer_removes_it_and_autosaves_again(
    qtbot, main_window, tiny_opened
) -> None:
    window = main_window
    path = app_settings.write_autosave({"format": "workbench-session", "version": 1})
    bar = window.offer_restore(path)
    window.set_opened("tiny-lm", tiny_opened, {"": "cpu"})
    bar.findChild(QPushButton, "discardRestoreButton").click()
    assert bar.isHidden() and app_settings.pending_autosave() is None
    window.autosave_now()
    assert json.loads(path.read_text(encoding="utf-8"))["source"] == "tiny-lm"


def _app_env(home: Path, cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_CACHE_HOME=str(home / "cache"),
        XDG_DATA_HOME=str(home / "data"),
        QT_QPA_PLATFORM="offscreen",
        HF_HUB_OFFLINE="1",
        WORKBENCH_CACHE_DIR=str(cache),
        WORKBENCH_DEMO_PARAMS="2M",
    )
    return env


def _steps(output: str) -> dict[str, dict[str, Any]]:
    steps = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return {step["step"]: step for step in steps}


def _run_until(mode: str, env: dict[str, str], cwd: Path, errors: Any) -> tuple[Any, dict]:
    """Start the driver in ``mode`` on the demo and read until its first step is reported."""
    process = subprocess.Popen(
        [sys.executable, str(DRIVER), mode, "--demo"],
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,  # its worker process too goes with a killpg of the group
    )
    for line in process.stdout:
        if line.startswith("{"):
            return process, json.loads(line)
    return process, {}


def _relaunch_and_inspect(env: dict[str, str], cwd: Path, *args: str) -> dict[str, dict]:
    """Launch the driver's ``inspect`` (the restore offer, Restore, then Quit); its steps,
    once it exited 0."""
    relaunch = subprocess.run(
        [sys.executable, str(DRIVER), "inspect", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )
    assert relaunch.returncode == 0, relaunch.stdout + relaunch.stderr[-4000:]
    return _steps(relaunch.stdout)


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("demo-cache")


@pytest.mark.slow  # two real app processes, each opening the 2M demo
@pytest.mark.parametrize("launch", ["workbench", "workbench --demo", "workbench PATH"])
def test_kill_9_then_relaunch_offers_and_keeps_the_autosave(tmp_path, demo_cache, launch) -> None:
    env = _app_env(tmp_path, demo_cache)
    errors = (tmp_path / "crashed-stderr.txt").open("w")
    crashed, edited = _run_until("edit", env, tmp_path, errors)  # its autosave written
    try:
        assert edited.get("step") == "edited", (tmp_path / "crashed-stderr.txt").read_text()[-4000:]
        os.kill(crashed.pid, signal.SIGKILL)  # the app dies with the work only in the autosave
        assert crashed.wait(timeout=60) == -signal.SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(crashed.pid, signal.SIGKILL)  # whatever it had started
        crashed.stdout.close()
        errors.close()
    (autosave,) = (tmp_path / "data").rglob(app_settings.AUTOSAVE_NAME)
    crashed_text = autosave.read_text(encoding="utf-8")
    assert json.loads(crashed_text)["device_map"] == edited["device_map"]

    args = {
        "workbench": [],
        "workbench --demo": ["--demo"],
        "workbench PATH": [str(demo_cache / "demo-llama-2m")],
    }[launch]
    steps = _relaunch_and_inspect(env, tmp_path, *args)
    assert steps["launched"]["offered"], steps
    assert steps["launched"]["question"].startswith("The last session did not end cleanly.")
    assert steps["launched"]["autosave_kept"], "the launch overwrote the crashed run's autosave"
    restored = steps["restored"]
    assert restored["device_map"] == edited["device_map"]
    assert restored["device_map"]["model.layers.0"] == "disk"
    assert restored["dirty"] and " * " in restored["title"], restored
    assert steps["asked"]["text"].startswith("Save changes to the session for demo-llama-2m")


@pytest.mark.slow  # real app processes, each opening the 2M demo
@pytest.mark.parametrize("unsaved", [True, False], ids=["unsaved work", "nothing unsaved"])
def test_sigterm_closes_the_window_without_asking(tmp_path, demo_cache, unsaved) -> None:
    """SIGTERM (a logout, ``kill``) closes the app as Quit does, without a question no one
    can answer: unsaved work stays in the autosave and the next start offers it; with nothing
    unsaved the exit is clean and nothing is offered. Before, SIGTERM ended the process at
    once and every next start said the last session "did not end cleanly"."""
    env = _app_env(tmp_path, demo_cache)
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as errors:
        process, step = _run_until("edit" if unsaved else "idle", env, tmp_path, errors)
        try:
            assert step.get("step") in ("edited", "idle"), stderr.read_text()[-4000:]
            os.kill(process.pid, signal.SIGTERM)
            assert process.wait(timeout=120) == 0, stderr.read_text()[-4000:]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.stdout.close()
    assert "SIGTERM received: closing the window" in stderr.read_text()
    autosaves = list((tmp_path / "data").rglob(app_settings.AUTOSAVE_NAME))
    if not unsaved:
        assert autosaves == []
        return
    (autosave,) = autosaves
    assert json.loads(autosave.read_text(encoding="utf-8"))["device_map"] == step["device_map"]
    steps = _relaunch_and_inspect(env, tmp_path)
    assert steps["launched"]["offered"] and steps["restored"]["device_map"] == step["device_map"]
    # the offer says what happened: no crash, a signal with work unsaved
    assert steps["launched"]["question"].startswith(
        "The last session was closed by SIGTERM with unsaved changes. Restore its session for"
    ), steps["launched"]
