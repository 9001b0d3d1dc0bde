"""The loaded model and the shared load check, in the real window with a real worker (issue 14).

The planner, the lanes and Load & dispatch ask one check (``workbench.runtime.load_check``):
a map the loader would refuse is never "ok" or "map valid", and Load is disabled with the
reason. Run and Verify say which model they act on; opening another model asks whether to
unload the loaded one, and the previous model's results are cleared either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PySide6.QtWidgets import QMessageBox, QPushButton
from user_input import compare_strategies

from workbench.gui.tree_model import modules_mime_data
from workbench.runtime.load_check import check_load
from workbench.runtime.protocol import Result

pytestmark = pytest.mark.gui

LOAD_TIMEOUT_MS = 180_000  # a cold worker imports torch + transformers on shared cores


@pytest.fixture
def stop_resource_tracker():
    """Stop multiprocessing's resource tracker after the test (the worker spawn started it)."""
    yield
    from multiprocessing import resource_tracker

    resource_tracker._resource_tracker._stop()


@pytest.fixture
def demo_window(
    stop_resource_tracker: Any, main_window: Any, open_in_window: Any, demo_dir: Path, tmp_path
) -> Any:
    open_in_window(main_window, demo_dir)
    panels = main_window.runtime_panels
    panels.bridge.host.offload_root = tmp_path / "offload"
    panels.controller.error_presenter = lambda *_: None  # recorded in controller.errors
    return main_window


@pytest.mark.slow  # opens the demo with transformers
@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has a cuda:1")
def test_a_map_on_devices_this_machine_lacks_cannot_be_loaded_and_says_why(
    qtbot, demo_window
) -> None:
    window = demo_window
    panels = window.runtime_panels
    window.lanes.lane(1).dropMimeData(modules_mime_data(["model"]))  # the test profile's GPU 1
    assert window.lanes.is_valid  # a valid plan for the profile...
    assert window.validity_status.text() == "map valid · cannot load on this machine"
    assert "cannot load" in window.lanes.problems_label.text()
    assert not panels.load_action.isEnabled()  # ...that the loader would refuse here
    assert "cuda:1" in panels.load_action.toolTip()
    assert panels.controller.load() is None  # not even started: the same check says why
    assert panels.bridge.host.pid is None
    assert "cuda:1" in panels.controller.errors[-1][1]
    window.lanes.lane("cpu").dropMimeData(modules_mime_data(["model", "lm_head"]))
    assert window.validity_status.text() == "map valid"
    assert panels.load_action.isEnabled()


def test_the_planner_says_ok_only_for_a_map_the_load_check_accepts(qtbot, tiny_window) -> None:
    window = tiny_window
    candidates = compare_strategies(qtbot, window, {0: 10**6, 1: 10**6, "cpu": 10**6})
    panel = window.planner_panel
    status_row = panel.table.rowCount() - 1
    for column, candidate in enumerate(candidates):
        check = check_load(window.session.opened, candidate.plan.device_map)
        assert candidate.load_check == check
        text = panel.table.item(status_row, column).text()
        assert text in ("not here", "plan only")  # GPUs not here, or no weights
        assert check.reason in panel.table.item(status_row, column).toolTip()


def _discard_if_asked(qtbot, window) -> None:
    if window.session.dirty:
        qtbot.waitUntil(lambda: window.documents.save_prompt is not None, timeout=5000)
        window.documents.save_prompt.button(QMessageBox.StandardButton.Discard).click()


def _answer_unload_prompt(qtbot, window, text: str) -> None:
    qtbot.waitUntil(lambda: window.unload_prompt is not None, timeout=5000)
    box = window.unload_prompt
    next(b for b in box.findChildren(QPushButton) if b.text().replace("&", "") == text).click()


@pytest.mark.slow  # a real worker loads, runs and verifies the demo
def test_an_all_disk_plan_loads_and_another_model_never_shows_its_results(
    qtbot, demo_window, whatif_config, demo_dir, open_in_window
) -> None:
    window = demo_window
    panels = window.runtime_panels
    inference = panels.inference_panel
    # planned with a CPU budget too small for any module: everything on disk, and that loads
    candidates = compare_strategies(qtbot, window, {"cpu": 1000, "disk": 10**10})
    auto = next(c for c in candidates if c.strategy == "auto")
    assert set(auto.plan.device_map.values()) == {"disk"} and auto.load_check.loadable
    assert window.planner_panel.table.item(window.planner_panel.table.rowCount() - 1, 0).text() == (
        "ok"
    )
    window.planner_panel.apply_buttons["auto"].click()
    assert window.validity_status.text() == "map valid" and panels.load_action.isEnabled()
    with qtbot.waitSignal(panels.controller.load_finished, timeout=LOAD_TIMEOUT_MS):
        panels.load_action.trigger()
    assert panels.controller.errors == []
    assert window.session.context.loaded.source == str(demo_dir)
    assert "demo-llama" in inference.loaded_label.text()
    assert "not the model on screen" not in inference.loaded_label.text()
    inference.max_tokens_spin.setValue(2)
    with qtbot.waitSignal(inference.run_finished, timeout=LOAD_TIMEOUT_MS):
        inference.verify_button.click()
    assert "PASS" in inference.verify_label.text()

    # another model, keeping the loaded one: the old results go, Run says what it runs on
    window.open_replacing(str(whatif_config))
    _discard_if_asked(qtbot, window)
    _answer_unload_prompt(qtbot, window, "Keep loaded")
    qtbot.waitUntil(lambda: window.session.source == str(whatif_config), timeout=60_000)
    qtbot.waitUntil(lambda: not window.open_thread.isRunning(), timeout=5000)
    assert "PASS" not in inference.verify_label.text()
    assert inference.layer_table.rowCount() == 0 and inference.output_edit.toPlainText() == ""
    assert "demo-llama" in inference.loaded_label.text()
    assert "not the model on screen" in inference.loaded_label.text()
    assert window.session.context.loaded is None  # nothing of this model is loaded

    # and back: the loaded model's own source is not asked about, Run acts on it again
    window.open_replacing(str(demo_dir))
    _discard_if_asked(qtbot, window)
    assert window.unload_prompt is None
    qtbot.waitUntil(lambda: window.session.source == str(demo_dir), timeout=60_000)
    qtbot.waitUntil(lambda: not window.open_thread.isRunning(), timeout=5000)
    assert window.session.context.loaded.source == str(demo_dir)
    assert "not the model on screen" not in inference.loaded_label.text()

    # loaded again, then another model, unloading: nothing is loaded and Run is off
    window.session.set_device_map(dict(auto.plan.device_map))
    qtbot.waitUntil(panels.load_action.isEnabled, timeout=5000)
    with qtbot.waitSignal(panels.controller.load_finished, timeout=LOAD_TIMEOUT_MS):
        panels.load_action.trigger()
    window.open_replacing(str(whatif_config))
    _discard_if_asked(qtbot, window)
    with qtbot.waitSignal(
        panels.bridge.state_changed, check_params_cb=lambda s: s == "idle", timeout=60_000
    ):
        _answer_unload_prompt(qtbot, window, "Unload")
    qtbot.waitUntil(lambda: window.session.source == str(whatif_config), timeout=60_000)
    qtbot.waitUntil(lambda: not window.open_thread.isRunning(), timeout=5000)
    assert not panels.controller.loaded
    assert inference.loaded_label.text() == "Runs on: no model loaded"
    assert not inference.run_button.isEnabled()


def _load_without_a_worker(qtbot, window, monkeypatch) -> None:
    """Load & dispatch the session's map; the worker's answer is the bridge's own signal."""
    panels = window.runtime_panels
    monkeypatch.setattr(panels.bridge, "load", lambda *_args, **_kwargs: 41)
    window.session.set_device_map({"": "cpu"})
    qtbot.waitUntil(panels.load_action.isEnabled, timeout=5000)
    panels.load_action.trigger()
    assert panels.controller.busy
    with qtbot.waitSignal(panels.controller.load_finished, timeout=5000):
        panels.bridge.result.emit(Result(41, "load", None))
    assert panels.controller.loaded and not panels.controller.stale


def _open_and_wait(qtbot, window, source: str, answer: str | None) -> None:
    """Open ``source`` as File > Recent does; answer the unload prompt, or check none came."""
    window.open_replacing(source)
    _discard_if_asked(qtbot, window)
    if answer is None:
        assert window.unload_prompt is None
    else:
        _answer_unload_prompt(qtbot, window, answer)
    qtbot.waitUntil(lambda: window.session.source == source, timeout=60_000)
    qtbot.waitUntil(lambda: not window.open_thread.isRunning(), timeout=5000)


@pytest.mark.slow  # opens the demo with transformers
def test_another_model_kept_loaded_offers_no_reload_and_the_question_comes_once(
    qtbot, demo_window, demo_dir, whatif_config, monkeypatch
) -> None:
    from workbench.resources import resource_path

    window = demo_window
    panels = window.runtime_panels
    controller, widget = panels.controller, panels.controller.progress_widget
    _load_without_a_worker(qtbot, window, monkeypatch)

    # the loaded model's own source, from File > Recent: not asked, it is the loaded one again
    recent = next(a for a in window.recent_menu.actions() if a.text() == str(demo_dir))
    before = window.session.context
    recent.trigger()
    _discard_if_asked(qtbot, window)
    assert window.unload_prompt is None
    qtbot.waitUntil(lambda: window.session.context is not before, timeout=60_000)
    qtbot.waitUntil(lambda: not window.open_thread.isRunning(), timeout=5000)
    assert window.session.context.loaded is not None
    assert window.session.context.loaded.source == str(demo_dir)
    assert "not the model on screen" not in panels.inference_panel.loaded_label.text()

    # another model, kept loaded: no "map changed since load" or Reload for it
    other = str(resource_path("configs", "llama-3.1-8b.json"))
    _open_and_wait(qtbot, window, other, "Keep loaded")
    assert not controller.stale
    assert not widget.stale_label.isVisibleTo(widget)
    assert not widget.reload_button.isVisibleTo(widget)
    assert "demo-llama" in widget.label.text()
    assert "not the model on screen" in widget.label.text()
    assert window.session.context.loaded is None

    # Keep loaded was the answer for this loaded model: not asked again
    _open_and_wait(qtbot, window, str(whatif_config), None)
    assert not controller.stale and "not the model on screen" in widget.label.text()

    # back to the loaded model: not asked; its map differs from the loaded one, so Reload
    _open_and_wait(qtbot, window, str(demo_dir), None)
    assert window.session.context.loaded is not None
    assert controller.stale and widget.reload_button.isVisibleTo(widget)
    assert "not the model on screen" not in widget.label.text()
