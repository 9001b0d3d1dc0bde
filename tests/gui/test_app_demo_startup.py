"""`workbench --demo` (the README's launch command, run from source): the demo is made on a
worker thread while the window stays responsive, then opened; a failure is shown and the
window keeps working."""

from __future__ import annotations

import shlex
import threading
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QCoreApplication, QEvent, QTimer
from PySide6.QtWidgets import QMessageBox

from workbench.gui.demo_startup import (
    DEMO_PARAMS_ENV,
    DEMO_THREAD_NAME,
    make_demo_folder,
    start_demo,
)
from workbench.gui.workers import running_threads


def _making_demo() -> bool:
    return any(thread.objectName() == DEMO_THREAD_NAME for thread in running_threads())


@pytest.mark.slow  # makes a 2M demo, then opens it with transformers
@pytest.mark.gui
def test_workbench_demo_makes_the_demo_off_the_gui_thread_then_opens_it(
    qtbot, qapp, clean_settings, tmp_path, monkeypatch
) -> None:
    from workbench.cli import main
    from workbench.gui.main_window import MainWindow
    from workbench.platform_integration import install_smoke_test

    cache = tmp_path / "cache"
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(cache))
    monkeypatch.setenv(DEMO_PARAMS_ENV, "2M")
    events_while_making: list[bool] = []
    ticked = threading.Event()

    def on_tick() -> None:
        windows = [w for w in qapp.topLevelWidgets() if isinstance(w, MainWindow)]
        if _making_demo() and windows and windows[0].isVisible():
            events_while_making.append(windows[0].busy_bar.isVisible())
            ticked.set()

    def start_held(window: Any) -> Any:
        # The maker waits (on the worker thread) until the event loop has run with the window
        # shown, so a fast machine cannot finish the demo before the first tick: no race. If
        # the loop never runs, the wait ends and the assertion below names the failure.
        def make(*args: Any, **kwargs: Any) -> Path:
            ticked.wait(timeout=120)
            return make_demo_folder(*args, **kwargs)

        return start_demo(window, make=make)

    monkeypatch.setattr("workbench.gui.app.start_demo", start_held)

    ticker = QTimer()
    ticker.setInterval(0)  # every pass of the event loop
    ticker.timeout.connect(on_tick)
    ticker.start()
    install_smoke_test(timeout_s=120)  # leaves exec() with 0 once a model is open
    try:
        exit_code = main(shlex.split("workbench --demo")[1:])  # -> run_app(demo=True)
    finally:
        ticker.stop()
        windows = [w for w in qapp.topLevelWidgets() if isinstance(w, MainWindow)]
        opened = [(w.session.source, w.session.tree) for w in windows if w.isVisible()]
        for window in windows:
            window.close()
        qapp.setStyleSheet("")
        QCoreApplication.removePostedEvents(qapp, QEvent.Type.Quit)  # see test_main_window
        qtbot.waitUntil(lambda: not running_threads(), timeout=10_000)

    assert exit_code == 0
    assert events_while_making, "the event loop never ran while the demo was being made"
    assert all(events_while_making), "no busy indicator while the demo was being made"
    assert [source for source, _ in opened] == [str(cache / "demo-llama-2m")]
    assert opened[0][1] is not None
    assert (cache / "demo-llama-2m" / "config.json").is_file()


@pytest.mark.slow  # opens the demo with transformers
@pytest.mark.gui
def test_the_window_processes_events_while_the_demo_is_made(qtbot, main_window, demo_dir) -> None:
    """The maker blocks until the GUI thread runs a timer: it cannot be on the GUI thread."""
    gui_ran = threading.Event()

    def make_after_the_gui_ran(**_reporters: Any) -> Path:
        if not gui_ran.wait(timeout=30):
            raise TimeoutError("the GUI thread processed no event while the demo was made")
        return demo_dir

    thread = start_demo(main_window, make=make_after_the_gui_ran)
    assert thread.isRunning()
    assert main_window.busy_bar.isVisibleTo(main_window)
    assert "Preparing the demo" in main_window.statusBar().currentMessage()
    QTimer.singleShot(0, gui_ran.set)
    qtbot.waitUntil(
        lambda: main_window.session.tree is not None or bool(main_window.errors), timeout=60_000
    )
    assert not main_window.errors, main_window.errors
    assert main_window.session.source == str(demo_dir)
    qtbot.waitUntil(lambda: not running_threads(), timeout=10_000)
    assert not main_window.busy_bar.isVisibleTo(main_window)


@pytest.mark.gui
def test_a_demo_that_cannot_be_made_is_reported_with_its_path(
    qtbot, main_window, tmp_path, monkeypatch
) -> None:
    not_a_folder = tmp_path / "cache-is-a-file"
    not_a_folder.write_text("", encoding="utf-8")
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(not_a_folder))
    monkeypatch.setenv(DEMO_PARAMS_ENV, "2M")

    start_demo(main_window)
    # the failure can come before a signal wait would connect: wait for what it shows
    qtbot.waitUntil(
        lambda: main_window.findChild(QMessageBox, "demoErrorDialog") is not None, timeout=30_000
    )
    box = main_window.findChild(QMessageBox, "demoErrorDialog")
    assert str(not_a_folder) in box.text()
    assert not main_window.busy_bar.isVisibleTo(main_window)
    assert main_window.session.tree is None
    box.close()
    qtbot.waitUntil(lambda: not running_threads(), timeout=10_000)


@pytest.mark.slow  # makes a 1M demo, then opens it with transformers
@pytest.mark.gui
def test_making_the_demo_counts_its_shards_on_the_bar_up_to_the_last(
    qtbot, main_window, tmp_path, monkeypatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(cache))
    monkeypatch.setenv(DEMO_PARAMS_ENV, "1M")
    bar = main_window.busy_bar
    shown: list[tuple[int, int]] = []  # (value, maximum) each time the bar moves
    on_gui_thread: list[bool] = []
    messages: list[str] = []

    def on_bar_value(value: int) -> None:
        shown.append((value, bar.maximum()))
        on_gui_thread.append(threading.current_thread() is threading.main_thread())

    bar.valueChanged.connect(on_bar_value)
    main_window.statusBar().messageChanged.connect(messages.append)

    start_demo(main_window)
    qtbot.waitUntil(
        lambda: main_window.session.tree is not None or bool(main_window.errors), timeout=120_000
    )
    assert not main_window.errors, main_window.errors
    qtbot.waitUntil(lambda: not running_threads(), timeout=10_000)

    folder = cache / "demo-llama-1m"
    assert main_window.session.source == str(folder)
    shards = len(list(folder.glob("*.safetensors")))
    assert shards == 4  # the cached demo is written in 4 shards
    assert [step for step in shown if step[0] >= 0] == [(k, shards) for k in range(shards + 1)]
    assert on_gui_thread and all(on_gui_thread)
    prefix = "Making the demo model: "
    stages = [m.removeprefix(prefix).removesuffix("…") for m in messages if m.startswith(prefix)]
    assert stages == [
        "writing tokenizer",
        "making random weights",
        "writing shards",
        *[f"writing shard {k} of {shards}" for k in range(1, shards + 1)],
        f"wrote {shards} shards",
        "writing config",
    ]
    # opened: the bar is hidden and a plain busy indicator again for the next task
    assert not bar.isVisibleTo(main_window)
    assert (bar.minimum(), bar.maximum()) == (0, 0)
