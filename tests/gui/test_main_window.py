"""The main window end to end: open a generated demo and a what-if config on a worker thread,
the contract GUI part 2 builds on, errors, drops, speed prediction, app identity."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QApplication, QTabWidget, QToolBar
from user_input import drop_file

from workbench import APP_ID, APP_NAME
from workbench.gui.tree_model import modules_mime_data

pytestmark = pytest.mark.gui


def test_contract_for_the_runtime_panels(main_window) -> None:
    from PySide6.QtGui import QUndoStack

    from workbench.runtime.session import Session

    window = main_window
    assert isinstance(window.session, Session)
    assert isinstance(window.undo_stack, QUndoStack)
    assert isinstance(window.main_toolbar, QToolBar)
    assert isinstance(window.bottom_tabs, QTabWidget)
    tabs = [window.bottom_tabs.tabText(i) for i in range(window.bottom_tabs.count())]
    assert "Log" in tabs
    assert window.hardware_profile().name == "test-2x24g"
    assert window.lanes is not None and window.tree_view is not None


@pytest.mark.slow  # opens a model with transformers on a worker thread
def test_open_generated_demo_without_freezing(qtbot, main_window, demo_dir, open_in_window) -> None:
    window = main_window
    thread = window.open_source(str(demo_dir))
    assert thread is not None
    assert window.busy_bar.isVisible()  # shown before any work finishes: the call returned at once
    qtbot.waitUntil(lambda: window.session.tree is not None or bool(window.errors), timeout=60_000)
    qtbot.waitUntil(lambda: not thread.isRunning(), timeout=5000)
    assert not window.errors, window.errors  # a failed open shows its cause, not a timeout
    assert not window.busy_bar.isVisible()
    opened = window.session.opened
    assert window.statusBar().currentMessage().startswith(f"Opened {opened.label} in ")
    assert opened.checkpoint is not None  # real safetensors shards
    assert window.session.device_map == {"": 0}
    assert window.tree_model.rowCount() == len(opened.tree.root.children)
    status = window.model_status.text()
    assert status.startswith(demo_dir.name) and "params" in status
    assert window.validity_status.text().startswith("map valid")  # (+ why it cannot load here)
    assert [lane.device for lane in window.lanes.lanes] == [0, 1, "cpu", "disk"]
    assert "opened" in window.log_view.toPlainText()
    qtbot.waitUntil(lambda: "tok/s" in window.speed_label.text(), timeout=5000)


@pytest.mark.slow  # opens a model with transformers on a worker thread
def test_open_whatif_config_and_move_updates_predicted_speed(
    qtbot, main_window, whatif_config, open_in_window
) -> None:
    window = main_window
    opened = open_in_window(window, whatif_config)
    assert opened.checkpoint is None  # shapes only
    qtbot.waitUntil(lambda: "tok/s" in window.speed_label.text(), timeout=5000)
    on_gpu = window.speed_prediction.tokens_per_s
    window.lanes.lane("disk").dropMimeData(modules_mime_data(["model.layers"]))
    qtbot.waitUntil(
        lambda: (
            window.speed_prediction is not None and window.speed_prediction.tokens_per_s < on_gpu
        ),
        timeout=5000,
    )
    assert window.undo_stack.undoText() == "Move 'model.layers' to disk"


@pytest.mark.slow  # opens a model with transformers on a worker thread
def test_a_bad_source_shows_an_error_and_the_window_keeps_working(
    qtbot, main_window, tmp_path
) -> None:
    window = main_window
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    thread = window.open_source(str(broken))
    qtbot.waitUntil(lambda: bool(window.errors), timeout=30_000)
    qtbot.waitUntil(lambda: not thread.isRunning(), timeout=5000)
    title, message = window.errors[0]
    assert title == "Could not open the model"
    assert "config.json" in message
    assert window.session.tree is None and not window.busy_bar.isVisible()


@pytest.mark.slow  # opens a model with transformers on a worker thread
def test_dropping_a_model_folder_opens_it(qtbot, main_window, demo_dir) -> None:
    window = main_window
    event = drop_file(window, demo_dir)
    assert event.isAccepted()
    qtbot.waitUntil(lambda: window.session.tree is not None, timeout=60_000)
    qtbot.waitUntil(lambda: not window.open_thread.isRunning(), timeout=5000)
    assert window.session.source == str(demo_dir)


def test_application_identity_matches_the_desktop_entry(qapp) -> None:
    from workbench.gui.app import configure_application

    configure_application(qapp)
    assert QApplication.applicationName() == APP_NAME
    assert QApplication.desktopFileName() == APP_ID
    assert "overBudget" in qapp.styleSheet()  # resources/styles/workbench.qss
    qapp.setStyleSheet("")


def test_every_toolbar_action_has_text_and_a_tooltip(main_window) -> None:
    for action in main_window.main_toolbar.actions():
        if action.isSeparator() or not action.text():
            continue
        assert action.toolTip(), action.text()
    shortcuts = {a.shortcut().toString() for a in main_window.actions_by_name.values()}
    assert {"Ctrl+O", "Ctrl+Z", "Ctrl+I", "Ctrl+E", "Ctrl+1", "Ctrl+P"} <= shortcuts


def test_switching_hardware_rebuilds_lanes_and_is_undoable(main_window) -> None:
    from workbench.models.hardware import load_profile

    window = main_window
    laptop = load_profile("cpu-laptop-16gb")
    window.hardware_selector.add_profile(laptop)
    window.hardware_selector.profile_chosen.emit(laptop)  # what picking it in the combo emits
    assert window.hardware_profile().name == "cpu-laptop-16gb"
    assert [lane.device for lane in window.lanes.lanes] == ["cpu", "disk"]
    assert window.session.budgets == laptop.budgets()
    assert window.undo_stack.undoText() == "Use hardware cpu-laptop-16gb"
    window.undo_stack.undo()
    assert [lane.device for lane in window.lanes.lanes] == [0, 1, "cpu", "disk"]
    assert window.hardware_profile().name == "test-2x24g"
    assert window.hardware_selector.currentText() == "test-2x24g"


def test_cache_browser_lists_nothing_from_an_empty_cache(qtbot, tmp_path) -> None:
    from workbench.gui.cache_browser import CacheBrowser

    browser = CacheBrowser(cache_dir=str(tmp_path))
    qtbot.addWidget(browser)
    assert browser.list_widget.count() == 0
    assert "No cached models" in browser.info_label.text()


def test_run_app_shows_the_main_window_and_returns_the_exit_code(qapp, clean_settings) -> None:
    from PySide6.QtCore import QCoreApplication, QEvent, QTimer

    from workbench.gui.app import run_app
    from workbench.gui.main_window import MainWindow

    seen: list[str] = []

    def close_windows() -> None:
        for widget in qapp.topLevelWidgets():
            if isinstance(widget, MainWindow) and widget.isVisible():
                seen.append(widget.windowTitle())
                widget.close()
        qapp.exit(0)

    import signal

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    QTimer.singleShot(300, close_windows)
    try:
        assert run_app() == 0
    finally:
        qapp.setStyleSheet("")
        # Closing the last window posts a Quit event (quitOnLastWindowClosed) that exec() no
        # longer sees once exit(0) ended it; left queued, it would end the next test's
        # waitSignal/waitUntil event loop at once (a TimeoutError in an unrelated test).
        QCoreApplication.removePostedEvents(qapp, QEvent.Type.Quit)
    assert seen == ["Model Memory Workbench"]
    # the app watched SIGTERM and Ctrl+C while it ran (termination), and gave them back
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert signal.set_wakeup_fd(-1) == -1


@pytest.mark.slow  # opens a model with transformers on a worker thread
def test_no_speed_is_predicted_for_a_map_over_budget(
    qtbot, main_window, whatif_config, open_in_window
) -> None:
    """A tok/s figure beside a red lane reads as a promise (found driving the app: "0.227
    tok/s" for a map 104 GiB over the CPU budget)."""
    window = main_window
    open_in_window(window, whatif_config)
    qtbot.waitUntil(lambda: "tok/s" in window.speed_label.text(), timeout=5000)
    tiny = {device: 1024 for device in window.session.budgets}
    window.edit_budgets(tiny)
    assert window.lanes.budget_problems
    qtbot.waitUntil(lambda: "does not fit" in window.speed_label.text(), timeout=5000)
    assert "tok/s" not in window.speed_label.text()
    assert window.lanes.budget_problems[0] in window.speed_label.text()
    window.undo_stack.undo()  # the budgets fit again: the speed comes back
    qtbot.waitUntil(lambda: "tok/s" in window.speed_label.text(), timeout=5000)


@pytest.mark.slow  # opens two models with transformers on a worker thread
def test_an_encoder_is_predicted_one_forward_not_tokens_per_second(
    qtbot, main_window, whatif_config, open_in_window
) -> None:
    """BERT as a masked LM generates nothing: found driving the app, the line said "tok/s" and
    "TTFT" for it, figures of a run its Inference tab never makes."""
    from workbench.resources import resource_path
    from workbench.runtime.formatting import format_seconds

    window = main_window
    open_in_window(window, resource_path("configs", "bert-base-uncased.json"))
    qtbot.waitUntil(lambda: "one forward over" in window.speed_label.text(), timeout=5000)
    prediction = window.speed_prediction
    text = window.speed_label.text()
    assert f"one forward over 128 tokens in {format_seconds(prediction.prefill_s)} (" in text
    assert "generates no tokens" in text and "tok/s" not in text and "TTFT" not in text
    # the forward is the prefill alone, which is also the time to the first token
    assert 0 < prediction.prefill_s == prediction.ttft_s
    open_in_window(window, whatif_config)  # a causal LM after it gets its tok/s back
    qtbot.waitUntil(lambda: "tok/s" in window.speed_label.text(), timeout=5000)
    assert "one forward" not in window.speed_label.text()


def _window_on_detected(qtbot, test_profile, whatif_config, open_in_window):
    """A window whose profile is this machine's, nothing measured yet (set
    ``WORKBENCH_CACHE_DIR`` to an empty folder first), showing a predicted speed."""
    from dataclasses import replace

    from workbench.gui.main_window import MainWindow

    window = MainWindow(
        profiles=[replace(test_profile, name="detected")],
        warm_worker=False,
        show_error=lambda title, text: None,
        bridge=None,
    )
    window.errors = []  # type: ignore[attr-defined]  # what open_in_window checks
    qtbot.addWidget(window, before_close_func=lambda w: w.session.mark_clean())
    window.show()
    open_in_window(window, whatif_config)
    qtbot.waitUntil(lambda: "tok/s" in window.speed_label.text(), timeout=5000)
    return window


@pytest.mark.slow  # opens a model with transformers on a worker thread
def test_the_detected_prediction_takes_the_host_probes_a_run_measured(
    qtbot, clean_settings, test_profile, whatif_config, open_in_window, tmp_path, monkeypatch
) -> None:
    """The worker measures this machine's host probes after its first run; the window's
    Predicted line, made before them with typical values, then predicts with them."""
    from workbench.models.dispatch_probe import DispatchOverhead, cached_dispatch_overhead

    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))  # nothing measured yet

    window = _window_on_detected(qtbot, test_profile, whatif_config, open_in_window)
    blocks = [layer for layer in window.speed_prediction.per_layer if ".layers." in layer.name]
    assert blocks[0].dispatch_s == pytest.approx(10 * 15e-6)  # typical: 15 us per call
    cached_dispatch_overhead(lambda: DispatchOverhead(1e-3, 1e-2, 1, 0.0))  # as a run would
    window.hardware.refresh_after_run()
    qtbot.waitUntil(lambda: window.speed_prediction.per_layer[1].dispatch_s > 1e-3, timeout=5000)
    blocks = [layer for layer in window.speed_prediction.per_layer if ".layers." in layer.name]
    assert blocks[0].dispatch_s == pytest.approx(10 * 1e-3)  # its 10 calls at 1 ms
    assert window.hardware_profile().dispatch_measured  # what the planner and lanes use too
    assert window.session.profile.name == "detected" and not window.session.dirty


@pytest.mark.slow  # opens a model with transformers on a worker thread
def test_the_detected_prediction_takes_the_cpu_kernels_a_comparison_measured(
    qtbot, clean_settings, test_profile, whatif_config, open_in_window, tmp_path, monkeypatch
) -> None:
    """Found driving the app on a fresh machine: the precision planner measures this CPU's
    kernel costs, and the comparison (and the run after it) predicted int8 SmolLM2 at 10.4
    tok/s while the Predicted line, with the typical kernel costs, said 9.37 for the same map.
    After a comparison the detected profile takes the cached kernels, as the planner did."""
    from workbench.models.device_probe import CpuKernelProbe, cached_cpu_kernels
    from workbench.models.speed import MEMORY_BANDWIDTH_UTILIZATION

    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))  # nothing measured yet

    window = _window_on_detected(qtbot, test_profile, whatif_config, open_in_window)
    assert not window.hardware_profile().kernel_costs.cpu_measured
    before = window.speed_prediction
    probe = CpuKernelProbe(
        bf16_gbps=1.5, efficiency={"int8": 0.9}, seconds={}, threads=2, nbytes=1, measured_at=0.0
    )
    cached_cpu_kernels(lambda: probe)  # what the precision planner's measured_profile leaves
    window.planner_panel.comparison_ready.emit([])
    qtbot.waitUntil(lambda: window.speed_prediction is not before, timeout=5000)
    profile = window.hardware_profile()
    assert (
        profile.kernel_costs.cpu_measured and profile.kernel_costs.efficiency("cpu", "int8") == 0.9
    )
    (cpu,) = [spec for spec in profile.devices if spec.device == "cpu"]
    assert cpu.memory_bandwidth_gbps == pytest.approx(1.5 / MEMORY_BANDWIDTH_UTILIZATION)
    assert window.session.profile.name == "detected" and not window.session.dirty


@pytest.mark.slow  # opens a model with transformers on a worker thread
def test_a_restored_profile_takes_the_figures_measured_since(
    qtbot, clean_settings, test_profile, whatif_config, open_in_window, tmp_path, monkeypatch
) -> None:
    """Found driving the app: a restored session's detected profile carried the dispatch cost
    saved with it, and once it had every probe the window never read the caches again, so
    after a run it said 9.88 tok/s where the worker, with the machine's newer figures,
    predicted 14.1. A run (or a comparison) now gives it the cached figures, newer or not."""
    from workbench.models.dispatch_probe import DispatchOverhead, cached_dispatch_overhead
    from workbench.models.hardware import with_dispatch_overhead

    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    window = _window_on_detected(qtbot, test_profile, whatif_config, open_in_window)
    saved = with_dispatch_overhead(window.hardware_profile(), DispatchOverhead(7e-5, 0.0, 2, 0.0))
    window.hardware._update_detected(lambda _detected: saved)  # as a restored session's
    qtbot.waitUntil(
        lambda: window.hardware_profile().module_call_us == pytest.approx(70), timeout=5000
    )
    cached_dispatch_overhead(lambda: DispatchOverhead(3.7e-5, 3.8e-4, 2, 0.0))  # measured since
    before = window.speed_prediction
    window.hardware.refresh_after_run()
    qtbot.waitUntil(lambda: window.speed_prediction is not before, timeout=5000)
    assert window.hardware_profile().module_call_us == pytest.approx(37)
    assert window.hardware_profile().forward_call_us == pytest.approx(380)
    shown = window.speed_prediction
    window.hardware.refresh_after_run()  # nothing newer: the same profile, no new prediction
    assert window.speed_prediction is shown and not window.session.dirty


@pytest.mark.slow  # opens a model with transformers on a worker thread
def test_an_adopted_detected_profile_takes_the_cached_figures(
    qtbot, clean_settings, test_profile, whatif_config, open_in_window, tmp_path, monkeypatch
) -> None:
    """Found driving kill -9 and Restore: the restored session's detected profile had the
    typical dispatch cost it was saved with, and the window predicted 577 tok/s for the GPT-2
    demo it had shown at 172 before the crash, with the machine's measured figures cached."""
    from dataclasses import replace

    from workbench.models.dispatch_probe import DispatchOverhead, cached_dispatch_overhead

    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    window = _window_on_detected(qtbot, test_profile, whatif_config, open_in_window)
    cached_dispatch_overhead(lambda: DispatchOverhead(3.7e-5, 3.8e-4, 2, 0.0))
    saved = replace(test_profile, name="detected")  # typical figures, as a session saved them
    window.hardware.adopt_profile(saved)
    assert window.hardware_profile().module_call_us == pytest.approx(37)
    assert window.hardware_profile().dispatch_measured
