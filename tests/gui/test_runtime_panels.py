"""The runtime panels inside the real main window, driven by a scripted worker host.

The host's events come from a real background thread, like the real reader thread; the real
worker process is exercised in test_load_flow.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

from workbench.big_modeling.transfers import TransferEvent
from workbench.gui.commands import push_move
from workbench.runtime.protocol import (
    CudaMemory,
    Failed,
    LoadSummary,
    Phase,
    Progress,
    Result,
    StateChanged,
    TelemetrySample,
    TransferBatch,
    WorkerExited,
)

pytestmark = pytest.mark.gui
GIB = 1 << 30


class ScriptedHost:
    """Records requests; the test plays the worker's answers from a background thread."""

    def __init__(self, on_event: Callable[[Any], None]) -> None:
        self.on_event = on_event
        self.state = "idle"
        self.requests: list[tuple] = []
        self.pid = None

    def play(self, *events: Any) -> None:
        thread = threading.Thread(target=lambda: [self.on_event(e) for e in events])
        thread.start()
        thread.join()

    def start(self) -> None:
        pass

    def load(self, source, device_map, *, dtype=None, options=None) -> int:
        self.requests.append(("load", source, dict(device_map)))
        return len(self.requests)

    def cancel(self) -> bool:
        self.requests.append(("cancel",))
        return True

    def infer(self, prompt, **kwargs) -> int:
        self.requests.append(("infer", prompt))
        self.infer_options = kwargs
        return len(self.requests)

    def unload(self) -> None:
        self.requests.append(("unload",))
        self.on_event(StateChanged("idle", "loaded"))

    def shutdown(self, timeout_s: float = 5.0) -> None:
        self.requests.append(("shutdown",))


@pytest.fixture
def window(tiny_window: Any, tiny_opened: Any) -> Any:
    # the scripted host plays a load of the tiny model: give it a checkpoint to load, or the
    # shared load check refuses it (a model without weights cannot load)
    weighted = type(tiny_opened)(**{**vars(tiny_opened), "checkpoint": "scripted checkpoint"})
    tiny_window.set_opened("tiny-lm", weighted, {"": "cpu"})
    panels = tiny_window.runtime_panels
    panels.bridge.host = ScriptedHost(panels.bridge._on_host_event)
    panels.controller.error_presenter = lambda *_: None  # recorded in controller.errors
    return tiny_window


def _loaded(window: Any, qtbot: Any) -> int:
    panels = window.runtime_panels
    panels.load_action.trigger()
    request_id = panels.controller.request_id
    summary = LoadSummary(
        "tiny-lm", "TinyLM", dict(window.session.device_map), {}, 0.5, 2848, False, False
    )
    with qtbot.waitSignal(panels.controller.load_finished, timeout=5000):
        panels.bridge.host.play(
            Phase(request_id, "opening"),
            Progress(request_id, 1424, 2848, "layers.0.attn.weight", "loading", 1.0),
            Progress(request_id, 2848, 2848, "norm.weight", "loading", 0.0),
            Phase(request_id, "ready"),
            Result(request_id, "load", summary),
        )
    return request_id


def test_install_adds_actions_tabs_and_progress(main_window: Any) -> None:
    panels = main_window.runtime_panels
    toolbar_actions = main_window.main_toolbar.actions()
    for action in (panels.load_action, panels.cancel_action, panels.unload_action):
        assert action in toolbar_actions
    tabs = [main_window.bottom_tabs.tabText(i) for i in range(main_window.bottom_tabs.count())]
    assert tabs[:3] == ["Memory", "Transfers", "Inference"] and "Log" in tabs
    assert panels.progress_widget.parent() is not None
    assert not panels.load_action.isEnabled()  # no model open yet
    assert not panels.cancel_action.isEnabled() and not panels.unload_action.isEnabled()
    assert panels.bridge.host.pid is None  # no worker until the first load


def test_a_worker_that_cannot_start_is_logged_and_loading_stays_offered(
    window: Any, caplog: Any
) -> None:
    panels = window.runtime_panels
    host = panels.bridge.host
    host.state = "stopped"

    def refuse_to_spawn() -> None:
        raise OSError("no more processes")

    host.start = refuse_to_spawn
    panels.warm_on_open = True
    caplog.set_level(logging.WARNING, logger="workbench.gui.runtime_panels")
    assert panels.warm_worker() is False
    assert "could not start the worker in the background: no more processes" in caplog.text
    host.state = "idle"
    panels._update_actions()
    assert panels.load_action.isEnabled()  # the first load starts a worker itself


def test_a_programming_error_while_warming_is_not_swallowed(window: Any) -> None:
    panels = window.runtime_panels
    host = panels.bridge.host
    host.state = "stopped"

    def broken() -> None:
        raise TypeError("a bug")

    host.start = broken
    panels.warm_on_open = True
    with pytest.raises(TypeError, match="a bug"):
        panels.warm_worker()
    host.state = "idle"


def test_load_shows_progress_then_loaded_state(window: Any, qtbot: Any) -> None:
    panels = window.runtime_panels
    panels.load_action.trigger()
    assert panels.bridge.host.requests == [("load", "tiny-lm", {"": "cpu"})]
    assert panels.progress_widget.bar.isVisibleTo(panels.progress_widget)
    assert not panels.load_action.isEnabled() and panels.cancel_action.isEnabled()
    request_id = panels.controller.request_id
    with qtbot.waitSignal(panels.bridge.progress, timeout=5000):
        panels.bridge.host.play(
            Progress(request_id, GIB, 4 * GIB, "model.layers.7.mlp.weight", "loading", 75.0)
        )
    label = panels.progress_widget.label.text()
    assert "1 GiB / 4 GiB" in label and "ETA 1 min 15 s" in label and "mlp.weight" in label
    assert panels.progress_widget.bar.value() == 250
    summary = LoadSummary("tiny-lm", "TinyLM", {"": "cpu"}, {}, 2.0, 4 * GIB, False, False)
    with qtbot.waitSignal(panels.controller.load_finished, timeout=5000):
        panels.bridge.host.play(
            Progress(request_id, 4 * GIB, 4 * GIB), Result(request_id, "load", summary)
        )
    bar = panels.progress_widget.bar
    assert bar.value() == 1000 and bar.isVisibleTo(panels.progress_widget)  # 100% stays shown
    assert not panels.progress_widget.cancel_button.isVisibleTo(panels.progress_widget)
    qtbot.waitUntil(lambda: not bar.isVisibleTo(panels.progress_widget), timeout=5000)
    assert "loaded in 2.0 s" in panels.progress_widget.label.text()
    assert panels.unload_action.isEnabled() and not panels.cancel_action.isEnabled()
    assert panels.inference_panel.run_button.isEnabled()


def test_editing_the_map_while_loaded_marks_it_changed_and_offers_reload(window, qtbot) -> None:
    panels = window.runtime_panels
    _loaded(window, qtbot)
    assert not panels.controller.stale
    with qtbot.waitSignal(panels.controller.stale_changed, timeout=2000):
        push_move(window.undo_stack, window.session, ["layers.3"], "disk")
    assert panels.progress_widget.stale_label.isVisibleTo(panels.progress_widget)
    window.undo_stack.undo()  # back to the loaded map: not stale any more
    assert not panels.controller.stale
    window.undo_stack.redo()
    assert panels.controller.stale
    panels.progress_widget.reload_button.click()
    assert panels.bridge.host.requests[-1] == ("load", "tiny-lm", window.session.device_map)
    assert panels.controller.busy and not panels.controller.stale


def test_bad_checkpoint_shows_dialog_and_load_can_be_retried(window, qtbot) -> None:
    panels = window.runtime_panels
    shown: list[tuple[str, str, str]] = []
    panels.controller.error_presenter = panels.controller._show_error_dialog
    before = dict(window.session.device_map)
    panels.load_action.trigger()
    failure = Failed(
        panels.controller.request_id,
        "model-00001-of-00002.safetensors: truncated header",
        details="Traceback ...",
        kind="bad_input",
        job="load",
    )
    with qtbot.waitSignal(panels.controller.load_failed, timeout=5000):
        panels.bridge.host.play(failure)
    shown = panels.controller.errors
    assert shown[0][0] == "The model could not be loaded" and "truncated header" in shown[0][1]
    dialog = panels.controller.last_error_dialog
    assert dialog.isVisible() and not dialog.isModal() and dialog.detailedText() == "Traceback ..."
    dialog.close()
    assert window.session.device_map == before and panels.load_action.isEnabled()
    panels.load_action.trigger()
    assert panels.controller.busy


def test_worker_death_while_loaded_is_reported_once(window, qtbot) -> None:
    panels = window.runtime_panels
    _loaded(window, qtbot)
    with qtbot.waitSignal(panels.controller.loaded_changed, timeout=5000):
        panels.bridge.host.play(
            WorkerExited(-9, 9, False, "worker process 42 was killed by signal 9")
        )
    assert [e[0] for e in panels.controller.errors] == ["The worker process died"]
    assert not panels.unload_action.isEnabled() and panels.load_action.isEnabled()


def test_telemetry_feeds_the_memory_plot_with_budgets(window, qtbot) -> None:
    panels = window.runtime_panels
    cuda = (CudaMemory(0, GIB, 2 * GIB, 3 * GIB, 24 * GIB),)
    panels.bridge.start()  # events are delivered once the worker runs
    with qtbot.waitSignal(panels.bridge.telemetry, timeout=5000):
        panels.bridge.host.play(TelemetrySample(100.0, GIB, 8 * GIB, cuda))
    assert panels.memory_plot.series_names == [
        "worker rss",
        "system available",
        "cuda:0 allocated",
        "cuda:0 reserved",
        "cuda:0 nvml",
    ]
    assert sorted(panels.memory_plot._budget_lines) == ["cpu", "cuda:0", "cuda:1"]


def test_file_backed_bytes_feed_their_own_series_only_when_known(window, qtbot) -> None:
    panels = window.runtime_panels
    panels.bridge.start()
    with qtbot.waitSignal(panels.bridge.telemetry, timeout=5000):
        panels.bridge.host.play(TelemetrySample(100.0, 3 * GIB, 8 * GIB))  # not reported
    assert panels.memory_plot.series_names == ["worker rss", "system available"]
    with qtbot.waitSignal(panels.bridge.telemetry, timeout=5000):
        panels.bridge.host.play(
            TelemetrySample(101.0, 3 * GIB, 8 * GIB, file_backed_bytes=GIB + 4096)
        )
    assert panels.memory_plot.series_names == [
        "worker rss",
        "system available",
        "worker file-backed",
    ]
    assert panels.memory_plot.latest("worker file-backed") == GIB + 4096
    assert panels.memory_plot.latest("worker rss") == 3 * GIB


def test_transfer_batches_fold_into_layer_bars(window, qtbot) -> None:
    panels = window.runtime_panels
    _loaded(window, qtbot)
    events = (
        TransferEvent("layers.0", 1_000_000, "disk", "cpu", 0.0, 0.001),
        TransferEvent("layers.0", 0, "cpu", "cpu", 0.001, 0.004, "compute"),
        TransferEvent("layers.0.attn", 0, "cpu", "cpu", 0.001, 0.002, "compute"),
        TransferEvent("", 0, "cpu", "cpu", 0.0, 0.01, "compute"),  # the root: dropped
    )
    with qtbot.waitSignal(panels.bridge.transfers, timeout=5000):
        panels.bridge.host.play(TransferBatch(9, 0, events))
    (row,) = panels.transfer_plot.last_forward
    assert row.module == "layers.0" and row.source == "disk"
    assert row.transfer_s == pytest.approx(0.001) and row.compute_s == pytest.approx(0.003)
    assert panels.transfer_plot.layers[0] == panels.units[0]


def test_unload_restarts_the_worker_and_marks_the_plot(window, qtbot) -> None:
    panels = window.runtime_panels
    _loaded(window, qtbot)
    with qtbot.waitSignal(panels.bridge.state_changed, timeout=5000):
        panels.unload_action.trigger()
    assert ("unload",) in panels.bridge.host.requests
    assert panels.controller.loaded_map is None and not panels.unload_action.isEnabled()
    assert panels.memory_plot.marker_labels[-1] == "unload"


def test_closing_the_window_shuts_the_worker_down(window) -> None:
    panels = window.runtime_panels
    window.close()
    assert ("shutdown",) in panels.bridge.host.requests
    assert not panels.memory_plot.timer.isActive()


def test_plots_refresh_at_10_hz_during_jobs_and_at_rest(window, qtbot) -> None:
    panels = window.runtime_panels
    panels.bridge.start()
    for state, before in (("idle", "idle"), ("loading", "idle"), ("loaded", "loading")):
        if state != before:
            with qtbot.waitSignal(panels.bridge.state_changed, timeout=5000):
                panels.bridge.host.play(StateChanged(state, before))
        assert panels.memory_plot.timer.interval() == 100, state
        assert panels.transfer_plot.timer.interval() == 100, state


def test_toolbar_cancel_during_a_run_stops_the_run(window, qtbot) -> None:
    panels = window.runtime_panels
    _loaded(window, qtbot)
    panels.inference_panel.run_button.click()
    assert panels.inference_panel.busy and panels.cancel_action.isEnabled()
    assert panels.bridge.host.requests[-1][0] == "infer"
    panels.cancel_action.trigger()
    assert panels.bridge.host.requests[-1] == ("cancel",)
    assert panels.inference_panel.status_label.text() == "stopping…"
    assert panels.controller.loaded  # a cancelled run leaves the model loaded


def test_the_log_tab_tells_load_start_end_cancel_and_unload(window, qtbot) -> None:
    panels = window.runtime_panels
    log = window.log_view
    _loaded(window, qtbot)
    text = log.toPlainText()
    assert "load #1 started: tiny-lm along a map of 1 entry on cpu" in text
    assert "load #1 finished: TinyLM in 0.5 s, 2.78 KiB (2,848 bytes)" in text
    panels.unload_action.trigger()
    assert "unload requested" in log.toPlainText()
    panels.load_action.trigger()
    second = panels.controller.request_id
    panels.cancel_action.trigger()
    assert "load #2: cancel requested" in log.toPlainText()  # loads count 1, 2: not requests
    with qtbot.waitSignal(panels.controller.load_failed, timeout=5000):
        panels.bridge.host.play(Failed(second, "load cancelled", kind="cancelled", job="load"))
    assert "load #2 cancelled after" in log.toPlainText()
    panels.load_action.trigger()
    with qtbot.waitSignal(panels.controller.load_failed, timeout=5000):
        panels.bridge.host.play(
            Failed(panels.controller.request_id, "shard.safetensors: truncated", kind="bad_input")
        )
    assert "The model could not be loaded: shard.safetensors: truncated" in log.toPlainText()


def test_inference_predicts_for_the_machine_the_model_runs_on(window, qtbot) -> None:
    panels = window.runtime_panels
    _loaded(window, qtbot)
    assert window.hardware_profile().name == "test-2x24g"  # a what-if profile is selected
    panels.inference_panel.run_button.click()
    assert panels.bridge.host.requests[-1][0] == "infer"
    # measured figures stand beside a prediction for the hardware the worker runs on (the
    # detected machine, profile None), not for the what-if profile (issue 14's decision)
    assert panels.bridge.host.infer_options["profile"] is None


def test_loads_are_numbered_one_two_and_a_one_entry_map_says_entry(
    window: Any, qtbot: Any, caplog: Any
) -> None:
    """Issue 14: the log numbered loads by request id (#1, #6, #8: runs and cancels count too)
    and said "a map of 1 entries"."""
    caplog.set_level(logging.INFO, logger="workbench.gui.load_panel")
    panels = window.runtime_panels
    _loaded(window, qtbot)
    for _ in range(3):  # requests in between: inference runs
        panels.bridge.host.infer("hello")
    _loaded(window, qtbot)
    started = [r.getMessage() for r in caplog.records if "started" in r.getMessage()]
    assert [m.split(" started")[0] for m in started] == ["load #1", "load #2"]
    assert "along a map of 1 entry on cpu" in started[0]
    finished = [r.getMessage() for r in caplog.records if "finished" in r.getMessage()]
    assert [m.split(" finished")[0] for m in finished] == ["load #1", "load #2"]


def test_the_transfers_prediction_is_for_the_machine_the_worker_runs_on(
    window: Any, qtbot: Any, test_profile: Any
) -> None:
    """Issue 14's decided question: beside measured figures, predict for the hardware the model
    runs on and say so; a what-if profile's prediction carries the profile's name."""
    panels = window.runtime_panels
    assert window.hardware_profile().name == "test-2x24g"  # the toolbar: a what-if profile
    _loaded(window, qtbot)

    def legend_names() -> list[str]:
        return [label.text for _, label in panels.transfer_plot.legend.items]

    assert panels.runtime_hardware().name == "detected"
    assert panels.transfer_plot.prediction  # the per-layer prediction is drawn
    assert "predicted for this machine" in legend_names()
    detected_disk = panels.runtime_hardware().disk_read_gbps
    assert panels.transfer_plot.peaks_gbps.get("disk") == pytest.approx(detected_disk)

    panels.runtime_profile = test_profile  # a worker said to run on the what-if hardware
    _loaded(window, qtbot)
    assert "predicted for test-2x24g" in legend_names()
    assert "predicted for this machine" not in legend_names()


def test_the_plan_time_prediction_names_the_what_if_profile(window: Any) -> None:
    window.update_speed_prediction(wait=True)
    assert window.speed_prediction is not None
    assert window.speed_label.text().startswith("<b>Predicted for test-2x24g:</b> ")


def test_the_transfers_prediction_is_for_the_precisions_the_model_was_loaded_with(
    window: Any, qtbot: Any
) -> None:
    """Found reading the code after driving an int8 load: the per-layer bars beside the measured
    ones were predicted for the unquantized tree, with the typical prefetch, not for what the
    worker loaded (the run's own prediction used the precisions, without prefetch)."""
    import torch

    from workbench.models.speed import predict_speed
    from workbench.runtime.precision_session import quantized_tree

    class Stored:  # what a checkpoint says of its dtypes (the planner's dtype reads it)
        def dtype_nbytes(self) -> dict:
            return {torch.float32: 2848}

    panels = window.runtime_panels
    opened = window.session.opened
    window.set_opened(
        "tiny-lm", type(opened)(**{**vars(opened), "checkpoint": Stored()}), {"": "cpu"}
    )
    window.session.set_precision_map({"layers": "int8"})
    _loaded(window, qtbot)
    assert panels.controller.loaded_precisions == {"layers": "int8"}
    window.session.set_precision_map({})  # a later edit: the loaded model keeps its precisions
    panels._prediction_for_loaded_map()
    opened, profile = window.session.opened, panels.runtime_hardware()
    expected = predict_speed(
        quantized_tree(opened, {"layers": "int8"}),
        {"": "cpu"},
        profile,
        prefetch=False,
        precisions={"layers": "int8"},
    )
    plain = predict_speed(opened.tree, {"": "cpu"}, profile)
    block = "layers.0"
    predicted = {p.name: p.time_s or p.transfer_s + p.compute_s for p in expected.per_layer}
    assert panels.transfer_plot.prediction[block] == pytest.approx(predicted[block])
    unquantized = {p.name: p.time_s or p.transfer_s + p.compute_s for p in plain.per_layer}
    assert predicted[block] != pytest.approx(unquantized[block])
    panels.controller._forget_loaded_model()
    assert panels.controller.loaded_precisions == {}
