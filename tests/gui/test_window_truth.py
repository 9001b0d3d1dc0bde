"""The window shows only the truth about the model on screen (issue 14, the last defects):
plots and late results of another model, the load bar, hover hints over the load message,
the chat's height, cut labels, plan-only models warming no worker, recent sessions.

The real window with a scripted worker host (its answers come from a background thread, as the
real reader thread's do); the load bar against the real worker is in ``test_load_progress.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from PySide6.QtCore import QCoreApplication, QPoint, Qt
from PySide6.QtGui import QFontMetrics, QStatusTipEvent
from PySide6.QtWidgets import QMenu

from workbench.gui import settings as app_settings
from workbench.gui.bridge import WorkerBridge
from workbench.gui.chat_view import TRANSCRIPT_MIN_LINES
from workbench.gui.inference_panel import CHAT
from workbench.gui.tree_model import DEVICE_COLUMN
from workbench.gui.window_actions import refresh_recent_menu
from workbench.runtime.protocol import (
    InferenceResult,
    LayerTiming,
    LoadSummary,
    Phase,
    Progress,
    Result,
    TelemetrySample,
    TokenStreamed,
    VerifyResult,
)

pytestmark = pytest.mark.gui
GIB = 1 << 30


class ScriptedHost:
    """Records requests; the test plays the worker's answers from a background thread."""

    def __init__(self, on_event: Callable[[Any], None], **_options: Any) -> None:
        self.on_event = on_event
        self.state = "stopped"
        self.started = 0
        self.requests: list[tuple] = []
        self.pid = None

    def play(self, *events: Any) -> None:
        thread = threading.Thread(target=lambda: [self.on_event(e) for e in events])
        thread.start()
        thread.join()

    def start(self) -> None:
        self.started += 1
        self.state = "idle"

    def load(self, source, device_map, *, dtype=None, options=None) -> int:
        self.requests.append(("load", source))
        return len(self.requests)

    def infer(self, prompt, **kwargs) -> int:
        self.requests.append(("infer", prompt))
        return len(self.requests)

    def verify(self, prompt, **kwargs) -> int:
        self.requests.append(("verify", prompt))
        return len(self.requests)

    def cancel(self) -> bool:
        return True

    def unload(self) -> None:
        self.requests.append(("unload",))

    def shutdown(self, timeout_s: float = 5.0) -> None:
        self.state = "stopped"


@pytest.fixture
def worker_bridge() -> WorkerBridge:
    return WorkerBridge(host_factory=ScriptedHost)


def _weighted(tiny_opened: Any) -> Any:
    """The tiny model with a checkpoint (the shared load check refuses one without)."""
    return type(tiny_opened)(**{**vars(tiny_opened), "checkpoint": "scripted checkpoint"})


@pytest.fixture
def window(main_window: Any, tiny_opened: Any) -> Any:
    main_window.set_opened("tiny-lm", _weighted(tiny_opened), {"": "cpu"})
    main_window.runtime_panels.controller.error_presenter = lambda *_: None
    return main_window


def _load(window: Any, qtbot: Any, source: str = "tiny-lm") -> None:
    panels = window.runtime_panels
    panels.load_action.trigger()
    request_id = panels.controller.request_id
    summary = LoadSummary(source, "TinyLM", {"": "cpu"}, {}, 0.5, 2848, True, True)
    with qtbot.waitSignal(panels.controller.load_finished, timeout=5000):
        panels.bridge.host.play(
            Progress(request_id, 2848, 2848, "norm.weight", "loading"),
            Result(request_id, "load", summary),
        )


def _infer_result(request_id: int) -> Result:
    value = InferenceResult(
        text=" jumps over the lazy dog",
        prompt_tokens=5,
        new_tokens=5,
        ttft_s=0.25,
        tokens_per_s=12.5,
        total_s=0.6,
        per_layer=(LayerTiming("layers.0", 0.002, 0.003, 2 * 2**20, "cpu", "cpu"),),
        predicted={"tokens_per_s": 10.0, "ttft_s": 0.2},
    )
    return Result(request_id, "infer", value)


def _open_other_model(window: Any, tiny_opened: Any) -> None:
    window.set_opened("other-lm", _weighted(tiny_opened), {"": "cpu"})


# -- 1, 8: the plots are the model on screen's -------------------------------------------


def test_another_model_starts_an_empty_memory_plot_and_transfers_plot(
    qtbot, window, tiny_opened
) -> None:
    panels = window.runtime_panels
    _load(window, qtbot)
    with qtbot.waitSignal(panels.bridge.telemetry, timeout=5000):
        panels.bridge.host.play(TelemetrySample(100.0, GIB, 8 * GIB))
    panels.transfer_plot.add_forward([LayerTiming("layers.0", 0.002, 0.003, 2**20, "cpu")])
    assert panels.memory_plot.sample_count == 1 and "load end" in panels.memory_plot.marker_labels
    assert panels.transfer_plot.forward_count == 1
    narrowest = panels.transfer_plot.minimumSizeHint().width()

    _open_other_model(window, tiny_opened)  # the tiny model stays loaded ("Keep loaded")

    assert panels.memory_plot.sample_count == 0 and panels.memory_plot.marker_labels == []
    assert panels.transfer_plot.forward_count == 0 and panels.transfer_plot.layers == []
    # the next forwards are the loaded model's, not the one on screen: the plot says so
    note = panels.transfer_plot.model_note
    assert note.isVisibleTo(panels.transfer_plot)
    assert "tiny-lm" in note.text() and "not the model on screen" in note.text()
    assert panels.transfer_plot.minimumSizeHint().width() == narrowest  # no wider dock
    window.set_opened("tiny-lm", _weighted(tiny_opened), {"": "cpu"})  # the loaded one again
    assert not note.isVisibleTo(panels.transfer_plot)


def test_the_memory_legend_sits_above_the_plotted_lines(qtbot, window) -> None:
    """A legend inside the view box paled the newest samples (the plot's right end)."""
    plot = window.runtime_panels.memory_plot
    plot.resize(900, 260)
    plot.append_sample(0.0, {"worker rss": GIB, "system available": 8 * GIB})
    plot.append_sample(1.0, {"worker rss": GIB, "worker file-backed": GIB // 2})
    plot.refresh()
    QCoreApplication.processEvents()
    view = plot.plot_widget.getPlotItem().getViewBox().sceneBoundingRect()
    legend = plot.legend.sceneBoundingRect()
    assert len(plot.legend.items) == 3
    assert not legend.intersects(view), (legend, view)
    assert legend.bottom() <= view.top()


# -- 2: a late result of another model -----------------------------------------------------


def test_a_run_result_arriving_after_a_model_switch_fills_no_label(
    qtbot, window, tiny_opened
) -> None:
    panels = window.runtime_panels
    _load(window, qtbot)
    inference = panels.inference_panel
    inference.set_mode("raw")
    inference.run_button.click()
    host = panels.bridge.host
    run_id = len(host.requests)
    with qtbot.waitSignal(panels.bridge.token, timeout=5000):
        host.play(TokenStreamed(run_id, 0, 7, " jumps", 0.25))
    assert inference.output_edit.toPlainText() == " jumps"

    _open_other_model(window, tiny_opened)  # while the run is in flight
    assert inference.output_edit.toPlainText() == ""
    with qtbot.waitSignal(inference.run_finished, timeout=5000) as finished:
        host.play(TokenStreamed(run_id, 1, 8, " over", 0.33), _infer_result(run_id))

    for label in (inference.ttft_label, inference.rate_label, inference.tokens_label):
        assert label.text() == "—"
    assert inference.output_edit.toPlainText() == ""
    assert inference.layer_table.rowCount() == 0
    assert inference.status_label.text() == "infer run 1 done for another model; see history"
    record = finished.args[0]  # the history keeps the run with its figures
    assert record.status == "done" and record.new_tokens == 5 and record.ttft_s == 0.25
    assert record.text == " jumps over the lazy dog"


# -- 3: the load bar and the status bar -------------------------------------------------


def test_the_load_bar_is_busy_without_bytes_and_follows_them_while_reading(qtbot, window) -> None:
    panels = window.runtime_panels
    bar = panels.progress_widget.bar
    panels.load_action.trigger()
    request_id = panels.controller.request_id
    host = panels.bridge.host
    with qtbot.waitSignal(panels.bridge.progress, timeout=5000):
        host.play(Phase(request_id, "building"), Progress(request_id, 0, 4 * GIB, "", "building"))
    assert (bar.minimum(), bar.maximum()) == (0, 0)  # busy, not "0%" for the whole build
    with qtbot.waitSignal(panels.bridge.progress, timeout=5000):
        host.play(Phase(request_id, "loading"), Progress(request_id, GIB, 4 * GIB, "w", "loading"))
    assert bar.maximum() == 1000 and bar.value() == 250
    with qtbot.waitSignal(panels.bridge.phase, timeout=5000):
        host.play(Phase(request_id, "dispatching"))
    assert bar.maximum() == 0
    summary = LoadSummary("tiny-lm", "TinyLM", {"": "cpu"}, {}, 2.0, 4 * GIB, False, False)
    with qtbot.waitSignal(panels.controller.load_finished, timeout=5000):
        host.play(Result(request_id, "load", summary))
    assert bar.maximum() == 1000 and bar.value() == 1000


def test_a_hovered_action_hint_does_not_cover_the_load_message(qtbot, window) -> None:
    panels = window.runtime_panels
    bar = window.statusBar()
    button = window.main_toolbar.widgetForAction(window.actions_by_name["export_map"])
    hint = window.actions_by_name["export_map"].statusTip() or "Export the map"
    QCoreApplication.sendEvent(button, QStatusTipEvent(hint))
    assert bar.currentMessage() == hint  # idle: hints show as usual
    panels.load_action.trigger()
    assert bar.currentMessage() == ""  # the hint shown before the click goes
    message = panels.progress_widget.label.text()
    QCoreApplication.sendEvent(button, QStatusTipEvent(hint))
    assert bar.currentMessage() == ""
    assert panels.progress_widget.label.text() == message


# -- 4, 5: the chat keeps its height, labels show whole ----------------------------------


def test_the_chat_stays_readable_after_run_and_verify_and_labels_are_whole(qtbot, window) -> None:
    window.resize(1440, 900)  # the first-run size on a 1600 x 1000 screen
    panels = window.runtime_panels
    window.bottom_tabs.setCurrentWidget(panels.inference_panel)
    _load(window, qtbot)
    inference = panels.inference_panel
    inference.set_mode(CHAT)
    inference.prompt_edit.setPlainText("What is the capital of France?")
    host = panels.bridge.host
    inference.run_button.click()
    status = inference.status_label
    qtbot.waitUntil(lambda: status.width() > 0, timeout=5000)
    assert status.text() == "infer running…"
    assert status.width() >= status.fontMetrics().horizontalAdvance(status.text())
    with qtbot.waitSignal(inference.run_finished, timeout=5000):
        host.play(_infer_result(len(host.requests)))
    inference.verify_button.click()
    verify = VerifyResult(
        True, 0.0, 0.0, True, "undispatched cpu", (1, 5, 32), greedy_compared=16, greedy_matched=16
    )
    with qtbot.waitSignal(inference.run_finished, timeout=5000):
        host.play(Result(len(host.requests), "verify", verify))
    QCoreApplication.processEvents()
    assert status.text() == "verify done"
    assert status.width() >= status.fontMetrics().horizontalAdvance(status.text())
    assert "PASS" in inference.verify_label.text()  # a verdict long enough to wrap
    chat, transcript = inference.chat_view, inference.chat_view.transcript
    lines = transcript.fontMetrics().lineSpacing()
    for dock_px in (300, 220):  # the first-run dock, and a shorter one: never squeezed
        window.resizeDocks([window.bottom_dock], [dock_px], Qt.Orientation.Vertical)
        QCoreApplication.processEvents()
        assert transcript.height() >= TRANSCRIPT_MIN_LINES * lines
        assert chat.height() >= chat.minimumSizeHint().height()  # not drawn under the prompt
        bottom = transcript.mapTo(inference, transcript.rect().bottomLeft()).y()
        assert bottom < inference.prompt_edit.mapTo(inference, QPoint(0, 0)).y()


def test_the_device_column_shows_whole(qtbot, main_window, open_in_window, demo_dir) -> None:
    main_window.resize(1440, 900)  # the first-run size on a 1600 x 1000 screen
    main_window._default_dock_sizes()
    QCoreApplication.processEvents()
    open_in_window(main_window, demo_dir)  # long class names: LlamaRotaryEmbedding
    view = main_window.tree_view
    header = view.header()
    chip = view.fontMetrics().horizontalAdvance("cuda:0") + 20
    assert header.sectionSize(DEVICE_COLUMN) >= chip
    right = header.sectionViewportPosition(DEVICE_COLUMN) + header.sectionSize(DEVICE_COLUMN)
    assert right <= view.viewport().width()  # no sideways scroll to see the devices


def test_the_colour_scale_numbers_show_whole(qtbot, window) -> None:
    plot = window.runtime_panels.transfer_plot
    plot.resize(900, 260)  # about the Transfers tab of the first-run window
    plot.show()
    plot.set_layers(["layers.0", "layers.1"])
    plot.set_prediction({"layers.0": 1.0}, label="predicted for this machine")
    plot.add_forward(
        [LayerTiming("layers.0", 0.0, 1.3, 0, ""), LayerTiming("layers.1", 0.0, 0.01, 0, "")]
    )
    plot.refresh()
    QCoreApplication.processEvents()
    axis = plot.heat_colorbar.getAxis("right")
    # the layout fits the widget: nothing (the scale's numbers) is pushed past its right edge
    assert plot.graphics.ci.geometry().width() <= plot.graphics.viewport().width()
    assert axis.sceneBoundingRect().right() <= plot.graphics.viewport().width()
    assert plot.heat_colorbar.levels()[1] > 1000  # the scale reads up to "1000" ms
    assert axis.width() >= QFontMetrics(plot.font()).horizontalAdvance("1000")


# -- 7: a plan-only model warms no worker ---------------------------------------------


def test_a_plan_only_model_warms_no_worker(main_window, tiny_opened) -> None:
    panels = main_window.runtime_panels
    panels.warm_on_open = True
    main_window.set_opened("llama-3.1-70b", tiny_opened, {"": "cpu"})  # no checkpoint
    assert panels.bridge.host.started == 0 and panels.bridge.state == "stopped"
    main_window.set_opened("tiny-lm", _weighted(tiny_opened), {"": "cpu"})
    assert panels.bridge.host.started == 1


# -- 10: sessions are listed apart from the models -------------------------------------


def test_recent_sessions_are_a_section_of_their_own(qtbot, clean_settings) -> None:
    app_settings.add_recent_model("old/s.wbsession.json")  # listed by an older version
    app_settings.add_recent_model("/models/demo")
    app_settings.add_recent_model("/work/new.wbsession.json", app_settings.RECENT_SESSIONS_KEY)
    menu = QMenu()
    refresh_recent_menu(menu, lambda _source: None)
    entries = [("section " if a.isSeparator() else "") + a.text() for a in menu.actions()]
    assert entries == [
        "/models/demo",
        "section Sessions",
        "/work/new.wbsession.json",
        "old/s.wbsession.json",
    ]
    assert menu.isEnabled()
