"""Worker threads of the main window are freed when done: no finished thread stays under the
window after many edits, and a replaced model's tree is freed (nothing keeps it alive)."""

from __future__ import annotations

import gc
import weakref

import pytest
from torch import nn

import workbench.gui.main_window as main_window_module
from workbench.gui.tree_model import modules_mime_data
from workbench.gui.workers import TaskThread
from workbench.models.tree import build_module_tree

pytestmark = pytest.mark.gui


def test_speed_and_planner_threads_are_freed_when_finished(qtbot, tiny_window) -> None:
    window = tiny_window
    for step in range(8):
        window.lanes.lane(step % 2).dropMimeData(modules_mime_data(["layers.3"]))
        window.update_speed_prediction(wait=True)
    panel = window.planner_panel
    for _ in range(2):
        with qtbot.waitSignal(panel.comparison_ready, timeout=30_000):
            panel.compare()
    qtbot.waitUntil(lambda: not panel.thread.isRunning())
    speed = weakref.ref(window.speed_thread)
    assert window.speed_prediction is not None
    # a finished thread's clean-up (queued on its ``finished``) lets go of the tree and map
    qtbot.waitUntil(lambda: window.speed_thread._args == () and panel.thread._args == ())
    finished = [t for t in window.findChildren(TaskThread) if not t.isRunning()]
    assert finished == []
    window.lanes.lane(0).dropMimeData(modules_mime_data(["layers.2"]))
    window.update_speed_prediction(wait=True)
    qtbot.waitUntil(lambda: speed() is None)  # the previous prediction's thread object goes


def test_an_opened_model_is_freed_after_another_is_opened(
    qtbot, main_window, tiny_opened, monkeypatch
) -> None:
    monkeypatch.setattr(main_window_module, "HUGE_TREE_MODULES", 100)  # take the gc.freeze path
    window = main_window
    model = nn.ModuleList(nn.Linear(2, 2) for _ in range(200))
    tree = build_module_tree(model)
    first = tiny_opened.__class__(**{**tiny_opened.__dict__, "tree": tree, "model": model})
    window.set_opened("wide", first, {"": "cpu"})
    window.lanes.lane(0).dropMimeData(modules_mime_data(["3"]))
    window.update_speed_prediction(wait=True)
    panel = window.planner_panel
    with qtbot.waitSignal(panel.comparison_ready, timeout=30_000):
        panel.compare()
    qtbot.waitUntil(lambda: not panel.thread.isRunning())
    freed = weakref.ref(tree)
    del tree, model, first
    window.set_opened("tiny-lm", tiny_opened, {"": "cpu"})
    window.update_speed_prediction(wait=True)
    # freed once the finished threads let go of it and a collection breaks its node cycles
    qtbot.waitUntil(lambda: gc.collect() >= 0 and freed() is None)
