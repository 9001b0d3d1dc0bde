"""Screenshots of the runtime panels: a real load, live plots, an inference run.

Runs the real main window and worker on a generated demo (llama, 60M parameters, fp16, 4 shards)
planned over cpu + disk, and writes:

  docs/screenshots/load-live-plots.png  the window during a load parked half-way by the
                                         tests' load hold (tests/job_holds.py): progress
                                         bar, Memory tab
  docs/screenshots/inference-run.png     the window after the load, three runs and a Verify:
                                         the Inference tab, and beside it the Memory plot (load
                                         and run markers) above the Transfers plot

For the second shot the script moves the two plots out of the tabs into one dock beside the
runtime dock (a layout made for the shot; each panel appears once). The Memory plot hides the
"system available" series (as a click on its legend entry does), so the worker's memory is not
flattened against the machine's free RAM.

Settings go to a temporary folder. Run under Xvfb, e.g.:
    Xvfb :98 -screen 0 1920x1080x24 & DISPLAY=:98 QT_QPA_PLATFORM=xcb python scripts/screenshots_runtime.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from workbench.gui.workers import run_event_loop_until

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "screenshots"
sys.path.insert(0, str(ROOT / "tests"))  # job_holds, for this process and the worker it spawns
GIB = 1 << 30


def main() -> int:
    scratch = Path(tempfile.mkdtemp(prefix="workbench-shots-"))
    os.environ["XDG_CONFIG_HOME"] = str(scratch / "config")
    os.environ["XDG_DATA_HOME"] = str(scratch / "data")
    from PySide6.QtCore import QSettings, Qt
    from PySide6.QtWidgets import QApplication, QDockWidget, QSplitter

    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(
        QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(scratch / "settings")
    )
    app = QApplication.instance() or QApplication(sys.argv)
    app.setApplicationName("Model Memory Workbench")
    from job_holds import HOLD_OBSERVER, hold_options

    from workbench.big_modeling import infer_auto_device_map
    from workbench.gui.bridge import WorkerBridge
    from workbench.gui.commands import SetBudgetsCommand, push_plan
    from workbench.gui.main_window import MainWindow
    from workbench.models import make_demo, open_model

    demo = Path(make_demo(scratch / "demo-llama-60m", arch="llama", params="60M", shards=4))
    window = MainWindow(autosave=False, bridge=WorkerBridge(load_observer=HOLD_OBSERVER))
    window.resize(1900, 1050)
    window.show()
    panels = window.runtime_panels
    panels.bridge.host.offload_root = scratch / "offload"
    panels.controller.error_presenter = lambda title, message, details: print(
        f"error: {title}: {message}"
    )
    opened = open_model(str(demo))
    window.set_opened(str(demo), opened)
    total = opened.tree.root.nbytes
    plan = infer_auto_device_map(
        opened.model,
        max_memory={"cpu": total // 2, "disk": 100 * total},
        no_split_module_classes=opened.no_split_modules,
    )
    push_plan(window.undo_stack, window.session, plan, strategy="auto")
    window.undo_stack.push(
        SetBudgetsCommand(window.session, {"cpu": 2 * GIB, "disk": 64 * GIB}, "Budgets")
    )
    window.bottom_dock.setMinimumHeight(430)
    window.bottom_tabs.setCurrentWidget(panels.memory_plot)
    panels.memory_plot.set_series_visible("system available", False)
    panels.bridge.start()
    run_event_loop_until(
        lambda: panels.memory_plot.sample_count > 20, 120
    )  # a little history first

    # during: a load parked half-way by the tests' load hold
    tensor_count = len(opened.model.state_dict())
    panels.controller.load_options = hold_options(tensor_count // 2)
    held: list[bool] = []
    panels.bridge.phase.connect(lambda ev: held.append(ev.phase == "held"))
    panels.load_action.trigger()
    run_event_loop_until(lambda: any(held), 300)
    run_event_loop_until(lambda: False, 1.5)  # the plot and the progress bar catch up
    OUT.mkdir(parents=True, exist_ok=True)
    window.grab().save(str(OUT / "load-live-plots.png"), "PNG")
    panels.controller.cancel()
    run_event_loop_until(lambda: not panels.controller.busy, 60)
    run_event_loop_until(lambda: False, 4.0)  # apart on the time axis: cancelled, then started

    # after: a full load and three runs
    panels.controller.load_options = {}
    panels.load_action.trigger()
    run_event_loop_until(lambda: panels.controller.loaded or bool(panels.controller.errors), 600)
    run_event_loop_until(lambda: False, 3.0)  # the first run's marker apart from "load end"
    inference = panels.inference_panel
    inference.max_tokens_spin.setValue(12)
    for prompt in ("The quick brown fox", "Once upon a time", "Model memory"):
        inference.prompt_edit.setPlainText(prompt)
        inference.run()
        run_event_loop_until(lambda: not inference.busy, 300)
        run_event_loop_until(lambda: False, 3.0)  # runs apart on the time axis
    inference.verify()
    run_event_loop_until(lambda: not inference.busy, 300)

    plots = QSplitter(Qt.Orientation.Vertical)
    for plot in (panels.memory_plot, panels.transfer_plot):
        window.bottom_tabs.removeTab(window.bottom_tabs.indexOf(plot))
        plots.addWidget(plot)
        plot.setVisible(True)  # a widget taken out of a tab widget stays hidden
    plots_dock = QDockWidget("Live plots", window)
    plots_dock.setObjectName("shotPlotsDock")
    plots_dock.setWidget(plots)
    window.splitDockWidget(window.bottom_dock, plots_dock, Qt.Orientation.Horizontal)
    run_event_loop_until(lambda: False, 0.5)  # lay the new dock out before sizing it
    window.resizeDocks([window.bottom_dock, plots_dock], [760, 1140], Qt.Orientation.Horizontal)
    window.resizeDocks([window.bottom_dock], [680], Qt.Orientation.Vertical)
    plots.setSizes([300, 380])
    window.bottom_tabs.setCurrentWidget(inference)
    run_event_loop_until(lambda: False, 2.0)
    window.grab().save(str(OUT / "inference-run.png"), "PNG")
    print(f"wrote {OUT / 'load-live-plots.png'} and {OUT / 'inference-run.png'}")
    window.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
