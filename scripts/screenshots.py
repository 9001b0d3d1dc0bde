"""Take the README screenshots of the main window: Llama 3.1 70B planned for an RTX 4090 box.

Run under a real X server so fonts and styles render as users see them::

    Xvfb :99 -screen 0 1920x1200x24 &
    DISPLAY=:99 QT_QPA_PLATFORM=xcb python scripts/screenshots.py

Writes ``docs/screenshots/main-70b-plan.png`` (the window with the auto plan applied) and
``docs/screenshots/planner-comparison.png`` (the planner with four strategies side by side for
``--compare-profile``, its balanced plan applied so the lanes show that hardware). The model is
opened by its bundled name, so no local path shows up. Settings go to a temporary folder, so
the user's own settings are untouched.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    from workbench.gui.workers import run_event_loop_until

    if not run_event_loop_until(predicate, timeout_s):
        raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _settle(app: object) -> None:
    for _ in range(20):
        app.processEvents()  # type: ignore[attr-defined]
        time.sleep(0.02)


def _show_every_tree_column(window: object) -> None:
    """Give the tree its columns' width (Flags included); the lanes take the rest."""
    view = window.tree_view  # type: ignore[attr-defined]
    header = view.header()
    last = header.count() - 1
    flags = max(view.sizeHintForColumn(last), header.sectionSizeHint(last)) + 12
    needed = sum(header.sectionSize(c) for c in range(last)) + flags
    needed += view.verticalScrollBar().sizeHint().width() + 8
    splitter = window.main_splitter  # type: ignore[attr-defined]
    total = sum(splitter.sizes())
    splitter.setSizes([min(needed, total - 300), max(300, total - needed)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-70b", help="bundled config or path")
    parser.add_argument("--profile", default="rtx4090-64gb", help="hardware profile name")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument(
        "--compare-profile", default="2x-h100-80gb", help="profile for the planner comparison"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args(argv)

    settings_dir = tempfile.mkdtemp(prefix="workbench-shots-")
    os.environ["XDG_DATA_HOME"] = os.environ["XDG_CONFIG_HOME"] = settings_dir
    from PySide6.QtCore import QSettings, Qt
    from PySide6.QtWidgets import QApplication

    from workbench.gui.app import configure_application
    from workbench.gui.main_window import MainWindow
    from workbench.models.hardware import load_profile

    app = QApplication.instance() or QApplication(sys.argv)
    configure_application(app)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, settings_dir)
    profile = load_profile(args.profile)
    window = MainWindow(profiles=[profile], autosave=False)
    window.resize(1680, 1050)
    window.show()
    start_s = time.perf_counter()
    window.open_source(args.model)
    _wait(lambda: window.session.tree is not None, 600, "the model to open")
    print(f"opened {args.model} in {time.perf_counter() - start_s:.1f} s")

    panel = window.planner_panel
    panel.reserve_by_shape.setChecked(True)
    panel.batch_spin.setValue(1)
    panel.context_spin.setValue(4096)
    thread = panel.compare()
    _wait(
        lambda: thread is not None and not thread.isRunning() and bool(panel.candidates),
        600,
        "the plans",
    )
    app.processEvents()
    if not panel.apply(args.strategy):
        print(f"the {args.strategy} plan did not fit: {panel.candidate(args.strategy)}")
        return 1
    window.update_speed_prediction(wait=True)
    window.resizeDocks([window.bottom_dock], [170], Qt.Orientation.Vertical)
    planner_width = panel.minimumSizeHint().width() + 24  # the whole panel, no scrolling
    window.resizeDocks([window.planner_dock], [planner_width], Qt.Orientation.Horizontal)
    window.tree_panel.depth_spin.setValue(2)
    window.tree_panel.expand_button.click()
    window.tree_panel.select_names(["model.layers.0"])
    window.bottom_tabs.setCurrentIndex(window.bottom_tabs.count() - 1)
    _settle(app)  # the docks take their new sizes first
    _show_every_tree_column(window)
    _settle(app)
    args.out.mkdir(parents=True, exist_ok=True)
    main_png = args.out / "main-70b-plan.png"
    window.grab().save(str(main_png))
    print(f"wrote {main_png}")

    window.set_hardware_profile(load_profile(args.compare_profile))  # the planner follows
    thread = panel.compare()
    _wait(
        lambda: thread is not None and not thread.isRunning() and bool(panel.candidates),
        600,
        "the plans",
    )
    app.processEvents()
    if not panel.apply("balanced"):
        print(f"the balanced plan did not fit {args.compare_profile}")
        return 1
    window.update_speed_prediction(wait=True)
    panel.table.setCurrentCell(0, 1)  # the balanced column and its trace
    window.planner_dock.raise_()
    window.resizeDocks([window.planner_dock], [planner_width], Qt.Orientation.Horizontal)
    _settle(app)  # the docks take their new sizes first
    _show_every_tree_column(window)
    _settle(app)
    planner_png = args.out / "planner-comparison.png"
    window.grab().save(str(planner_png))
    print(f"wrote {planner_png}")
    window.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
