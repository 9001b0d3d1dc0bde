"""Latency the user feels (issue 14): the worker starts, and imports torch, in the background as
soon as a model is open, so a click on Load & dispatch pays only for the load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from workbench.gui.commands import push_plan

pytestmark = [pytest.mark.gui, pytest.mark.slow]

WARM_TIMEOUT_MS = 180_000  # a cold worker imports torch + transformers on a shared machine


@pytest.fixture
def stop_resource_tracker():
    """Stop multiprocessing's resource tracker after the test (see test_load_flow)."""
    yield
    from multiprocessing import resource_tracker

    resource_tracker._resource_tracker._stop()


def test_opening_a_model_warms_the_worker_and_load_uses_it(
    stop_resource_tracker: Any,
    main_window: Any,
    open_in_window: Any,
    demo_dir: Path,
    qtbot: Any,
    tmp_path: Path,
) -> None:
    panels = main_window.runtime_panels
    panels.warm_on_open = True
    panels.bridge.host.offload_root = tmp_path / "offload"
    panels.controller.error_presenter = lambda *_: None
    assert panels.bridge.state == "stopped"  # an empty window starts no worker
    label = panels.progress_widget.label
    with qtbot.waitSignal(panels.bridge.ready, timeout=WARM_TIMEOUT_MS) as ready:
        open_in_window(main_window, demo_dir)
        assert panels.bridge.state != "stopped"  # spawned as the model opened, no click
        assert label.text() == "worker warming up (importing torch)…"
    warm_pid = panels.bridge.host.pid
    assert ready.args[0].pid == warm_pid and panels.bridge.warm
    assert label.text() == "worker ready"

    push_plan(main_window.undo_stack, main_window.session, {"": "cpu"}, strategy="auto")
    qtbot.waitUntil(panels.load_action.isEnabled, timeout=5000)
    with qtbot.waitSignal(panels.controller.load_finished, timeout=WARM_TIMEOUT_MS):
        panels.load_action.trigger()
        assert panels.controller.busy, panels.controller.errors
    assert panels.bridge.host.pid == warm_pid  # the load ran in the warmed worker
    assert panels.controller.loaded
