"""The whole runtime flow in the real window with a real worker process and a real checkpoint:
open the demo, plan cpu+disk, load, generate, verify, plots; cancel; SIGKILL; retry."""

from __future__ import annotations

import csv
import io
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from job_holds import HOLD_OBSERVER, hold_options
from PySide6.QtCore import QPointF
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QToolTip

from workbench.gui.bridge import WorkerBridge
from workbench.gui.commands import push_plan

pytestmark = [pytest.mark.gui, pytest.mark.slow]

LOAD_TIMEOUT_MS = 180_000  # a cold worker imports torch + transformers; 8 engineers share 2 cores


@pytest.fixture
def worker_bridge() -> WorkerBridge:
    """The window's worker runs the tests' load hold (``tests/job_holds.py``)."""
    return WorkerBridge(load_observer=HOLD_OBSERVER)


@pytest.fixture
def demo_window(
    stop_resource_tracker: Any,
    main_window: Any,
    open_in_window: Any,
    demo_dir: Path,
    tmp_path: Path,
) -> Any:
    """The main window with the generated demo open and planned over cpu + disk.

    ``stop_resource_tracker`` comes first, so it is torn down last: after the window closed and
    its worker exited (a live worker holds the tracker's pipe, and stopping it would wait)."""
    return _planned_window(main_window, open_in_window(main_window, demo_dir), tmp_path)


def _planned_window(main_window: Any, opened: Any, tmp_path: Path) -> Any:
    from workbench.big_modeling import infer_auto_device_map

    total = opened.tree.root.nbytes
    plan = infer_auto_device_map(
        opened.model,
        max_memory={"cpu": total // 2, "disk": 100 * total},
        no_split_module_classes=opened.no_split_modules,
    )
    assert {"cpu", "disk"} <= set(plan.values()), plan
    push_plan(main_window.undo_stack, main_window.session, plan, strategy="auto")
    panels = main_window.runtime_panels
    # the worker's machine as these tests describe it: the test profile's 3 GB/s disk, so the
    # link-peak figures beside the measured ones are checkable by hand
    panels.runtime_profile = main_window.hardware_profile()
    panels.bridge.host.offload_root = tmp_path / "offload"
    panels.controller.error_presenter = lambda *_: None  # recorded in controller.errors
    return main_window


def _hover_slowest_bar(window: Any, qtbot: Any) -> tuple[str, str]:
    """Show the Transfers tab, move the real mouse over the slowest bar of the last forward and
    return (its module, the tooltip text)."""
    plot = window.runtime_panels.transfer_plot
    window.bottom_tabs.setCurrentWidget(plot)
    plot.refresh()
    # a layer that moved weights: its tooltip has a transfer rate (a compute-only layer can be
    # the slowest on a busy machine)
    slowest = max(
        (t for t in plot.last_forward if t.nbytes > 0), key=lambda t: t.transfer_s + t.compute_s
    )
    index, top_ms = (
        plot.layers.index(slowest.module),
        (slowest.transfer_s + slowest.compute_s) * 1e3,
    )
    view_box = plot.bar_plot.getViewBox()

    def bar_in_view() -> bool:
        (x0, x1), (_, y1) = view_box.viewRange()
        return x0 <= index <= x1 and y1 >= top_ms

    qtbot.waitUntil(bar_in_view, timeout=5000)  # the bar chart auto-ranges on its next paint
    viewport = plot.graphics.viewport()
    heights = iter([0.4, 0.6] * 50)  # a move to where the mouse already is sends no event

    def hovered() -> bool:
        # map anew on every try: a late repaint may still move the view
        scene_pos = view_box.mapViewToScene(QPointF(index, top_ms * next(heights)))
        qtbot.mouseMove(viewport, plot.graphics.mapFromScene(scene_pos))
        return QToolTip.isVisible()

    qtbot.waitUntil(hovered, timeout=5000)
    return slowest.module, QToolTip.text()


def _held(panels: Any, qtbot: Any) -> None:
    """Start a load that parks after 2 tensors (the tests' hold) and wait for it."""
    panels.controller.load_options = hold_options(2)
    with qtbot.waitSignal(
        panels.bridge.phase,
        check_params_cb=lambda ev: ev.phase == "held",
        timeout=LOAD_TIMEOUT_MS,
    ):
        panels.load_action.trigger()
    assert panels.controller.busy


def test_full_flow_load_generate_verify_plots(demo_window: Any, qtbot: Any, tmp_path: Path) -> None:
    panels = demo_window.runtime_panels
    planned = dict(demo_window.session.device_map)
    progress: list[Any] = []
    phases: list[str] = []
    panels.bridge.progress.connect(progress.append)
    panels.bridge.phase.connect(lambda ev: phases.append(ev.phase))

    with qtbot.waitSignal(panels.controller.load_finished, timeout=LOAD_TIMEOUT_MS):
        panels.load_action.trigger()
    assert panels.controller.errors == []
    assert [p for p in phases if p not in ("dispatching", "paging in")] == [
        "building",
        "loading",
        "ready",
    ]
    assert phases.index("paging in") < phases.index("ready")  # the mapped weights, read now
    done = [ev.bytes_done for ev in progress]
    assert done == sorted(done) and progress[-1].fraction == 1.0
    bar = panels.progress_widget.bar
    assert bar.value() == bar.maximum() and bar.isVisibleTo(panels.progress_widget)
    assert panels.controller.loaded_map == planned
    assert not panels.cancel_action.isEnabled() and panels.unload_action.isEnabled()
    worker = psutil.Process(panels.bridge.host.pid)
    assert worker.nice() >= psutil.Process().nice() + 5  # the GUI wins the CPU over the worker

    inference = panels.inference_panel
    inference.max_tokens_spin.setValue(4)
    with qtbot.waitSignal(inference.run_finished, timeout=LOAD_TIMEOUT_MS) as run:
        inference.run_button.click()
    record = run.args[0]
    assert record.status == "done" and record.new_tokens == 4
    assert record.device_map == planned
    assert inference.output_edit.toPlainText() != ""
    assert inference.ttft_label.text() not in ("—", "…")
    assert inference.layer_table.rowCount() > 0

    with qtbot.waitSignal(inference.run_finished, timeout=LOAD_TIMEOUT_MS) as run:
        inference.verify_button.click()
    assert run.args[0].verify["passed"] is True
    assert "PASS" in inference.verify_label.text()

    qtbot.waitUntil(lambda: panels.memory_plot.sample_count > 0, timeout=10_000)
    assert "worker rss" in panels.memory_plot.series_names
    assert panels.memory_plot.marker_labels[:2] == ["load start", "load end"]
    assert any(label.startswith("infer #") for label in panels.memory_plot.marker_labels)
    transfer = panels.transfer_plot
    assert transfer.forward_count > 0
    disk_rows = [t for t in transfer.last_forward if t.source == "disk"]
    assert disk_rows and all(t.nbytes > 0 for t in disk_rows)  # the disk layers were streamed
    assert transfer.heatmap().max() > 0
    module, tooltip = _hover_slowest_bar(demo_window, qtbot)
    assert module in tooltip and "iB at " in tooltip and "B/s" in tooltip  # KiB/MiB, GB/MB/s
    # the speed model's prediction is drawn per layer on the bar chart
    assert transfer.prediction and set(transfer.prediction) <= set(transfer.layers)
    _, predicted_ms = transfer.predicted_curve.getOriginalDataset()
    assert len(predicted_ms) == len(transfer.layers) and np.nanmax(predicted_ms) > 0
    # peaks from the profile: disk 3 GB/s; no host-to-device line, the map has no GPU
    assert transfer.peaks_gbps == {"disk": 3.0}
    assert [line.value() for line in transfer._peak_lines] == [3.0]
    _, at_peak_ms = transfer.at_peak_curve.getOriginalDataset()
    disk_index = transfer.layers.index(disk_rows[0].module)
    assert at_peak_ms[disk_index] == pytest.approx(disk_rows[0].nbytes / 3e9 * 1e3)

    rows = list(
        csv.reader(io.StringIO(panels.transfer_plot.export_csv(tmp_path / "t.csv").read_text()))
    )
    assert rows[0][0] == "step" and len(rows) > 1
    assert not QImage(str(panels.memory_plot.export_png(tmp_path / "m.png"))).isNull()
    history = inference.history.model.export_json(tmp_path / "runs.json").read_text()
    assert '"map_id"' in history and '"passed": true' in history

    loaded_rss = panels.memory_plot.latest("worker rss")
    with qtbot.waitSignal(
        panels.bridge.state_changed, check_params_cb=lambda s: s == "idle", timeout=60_000
    ):
        panels.unload_action.trigger()
    assert panels.controller.loaded_map is None
    assert demo_window.session.device_map == planned
    # the fresh worker has not even imported torch: the plot shows the memory drop
    qtbot.waitUntil(
        lambda: panels.memory_plot.latest("worker rss") < loaded_rss / 2, timeout=60_000
    )


def test_cancel_mid_load_returns_to_idle(demo_window: Any, qtbot: Any) -> None:
    """How soon (the 1 s target) is measured by ``benchmarks/bench_cancel.py``."""
    panels = demo_window.runtime_panels
    planned = dict(demo_window.session.device_map)
    _held(panels, qtbot)
    with qtbot.waitSignal(panels.controller.busy_changed, timeout=LOAD_TIMEOUT_MS):
        panels.progress_widget.cancel_button.click()
    assert not panels.controller.busy and not panels.controller.loaded
    assert panels.load_action.isEnabled() and not panels.cancel_action.isEnabled()
    assert panels.controller.errors == []  # a cancel is not an error
    assert "cancelled" in panels.progress_widget.label.text()
    assert demo_window.session.device_map == planned
    assert panels.memory_plot.marker_labels[-1] == "load cancelled"


def test_sigkill_mid_load_shows_an_error_and_a_later_load_succeeds(
    demo_window: Any, qtbot: Any
) -> None:
    panels = demo_window.runtime_panels
    planned = dict(demo_window.session.device_map)
    shown: list[tuple[str, str, str]] = []
    panels.controller.error_presenter = panels.controller._show_error_dialog
    _held(panels, qtbot)
    with qtbot.waitSignal(panels.controller.load_failed, timeout=30_000) as failed:
        os.kill(panels.bridge.host.pid, signal.SIGKILL)
    assert failed.args[0].kind == "worker_died"
    shown = panels.controller.errors
    assert len(shown) == 1 and "signal 9" in shown[0][1]
    dialog = panels.controller.last_error_dialog
    assert dialog is not None and dialog.isVisible() and not dialog.isModal()
    assert "device map is unchanged" in dialog.text()
    dialog.close()
    assert demo_window.isVisible() and demo_window.session.device_map == planned
    assert panels.load_action.isEnabled()

    panels.controller.load_options = {}
    with qtbot.waitSignal(panels.controller.load_finished, timeout=LOAD_TIMEOUT_MS):
        panels.load_action.trigger()
    assert panels.controller.loaded_map == planned


def test_truncated_shard_through_the_real_worker_shows_the_error_dialog(
    stop_resource_tracker: Any,
    main_window: Any,
    open_in_window: Any,
    demo_dir: Path,
    tmp_path: Path,
    qtbot: Any,
) -> None:
    bad = tmp_path / "bad-demo"
    shutil.copytree(demo_dir, bad)
    window = _planned_window(main_window, open_in_window(main_window, bad), tmp_path)
    shard = sorted(bad.glob("*.safetensors"))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # cut short on disk after it was opened
    panels = window.runtime_panels
    planned = dict(window.session.device_map)
    panels.controller.error_presenter = panels.controller._show_error_dialog
    with qtbot.waitSignal(panels.controller.load_failed, timeout=LOAD_TIMEOUT_MS) as failed:
        panels.load_action.trigger()
    assert failed.args[0].kind == "bad_input"
    dialog = panels.controller.last_error_dialog
    assert dialog is not None and dialog.isVisible() and not dialog.isModal()
    assert dialog.windowTitle() == "The model could not be loaded"
    assert shard.name in dialog.text() and "device map is unchanged" in dialog.text()
    assert dialog.detailedText().strip(), "the worker sent no details for a bad checkpoint"
    dialog.close()
    assert window.session.device_map == planned and panels.load_action.isEnabled()
    assert not panels.controller.loaded


def test_an_unusable_offload_folder_is_a_failed_load_that_says_what_to_do(
    demo_window: Any, qtbot: Any, tmp_path: Path
) -> None:
    panels = demo_window.runtime_panels
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    panels.bridge.host.offload_root = blocker / "sub"
    panels.controller.error_presenter = panels.controller._show_error_dialog
    with qtbot.waitSignal(panels.controller.load_failed, timeout=5000) as failed:
        panels.load_action.trigger()
    assert failed.args[0].kind == "bad_input" and failed.args[0].job == "load"
    dialog = panels.controller.last_error_dialog
    assert dialog is not None and dialog.isVisible() and not dialog.isModal()
    assert dialog.windowTitle() == "The offload folder cannot be created"
    text = dialog.text()
    assert str(blocker / "sub") in text and "WORKBENCH_OFFLOAD_DIR" in text
    assert "device map is unchanged" in text and not text.startswith("[Errno")
    assert panels.progress_widget.label.text() == "load failed"
    assert panels.memory_plot.marker_labels == ["load failed"]
    assert "The offload folder cannot be created" in demo_window.log_view.toPlainText()
    assert panels.bridge.host.pid is None  # no worker was started for a load that cannot run
    assert panels.load_action.isEnabled() and not panels.controller.busy
    dialog.close()


def test_a_cancelled_reload_leaves_nothing_saying_a_model_is_loaded(
    demo_window: Any, qtbot: Any
) -> None:
    """A load that does not finish retires the worker, model and all (found driving the app:
    after Load, Load again, Cancel, the Inference tab still said "(loaded)" and Run failed)."""
    panels = demo_window.runtime_panels
    with qtbot.waitSignal(panels.controller.load_finished, timeout=LOAD_TIMEOUT_MS):
        panels.load_action.trigger()
    assert panels.controller.loaded and demo_window.session.context.loaded is not None
    _held(panels, qtbot)
    with qtbot.waitSignal(panels.controller.busy_changed, timeout=LOAD_TIMEOUT_MS):
        panels.progress_widget.cancel_button.click()
    inference = panels.inference_panel
    assert not panels.controller.loaded and panels.controller.loaded_map is None
    assert demo_window.session.context.loaded is None
    assert not panels.unload_action.isEnabled() and panels.load_action.isEnabled()
    assert not inference.run_button.isEnabled() and not inference.verify_button.isEnabled()
    assert "(loaded)" not in inference.loaded_label.text()
