"""Start the desktop app: application identity, style, settings format, the main window."""

from __future__ import annotations

import logging
import sys

from PySide6.QtCore import QSettings
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from workbench import APP_ID, APP_NAME, __version__
from workbench.gui import settings as app_settings
from workbench.gui.demo_startup import start_demo
from workbench.gui.main_window import MainWindow
from workbench.gui.settings import ORGANIZATION
from workbench.gui.termination import TerminationWatch
from workbench.models.warmup import start_warm_up, wait_for_warm_up
from workbench.platform_integration import set_windows_app_user_model_id
from workbench.resources import resources_root


def configure_application(app: object) -> None:
    """Set the identity (name, desktop file, icon), settings format and style sheet."""
    assert isinstance(app, QApplication)
    app.setApplicationName(APP_NAME)
    app.setApplicationVersion(__version__)
    app.setOrganizationName(ORGANIZATION)
    app.setDesktopFileName(APP_ID)
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    app.setStyle("Fusion")  # Fusion follows the system palette, light or dark
    icons = resources_root() / "icons"
    for name in ("app.svg", "workbench.svg", f"{APP_ID}.svg"):
        if (icons / name).is_file():
            app.setWindowIcon(QIcon(str(icons / name)))
            break
    style = resources_root() / "styles" / "workbench.qss"
    if style.is_file():
        app.setStyleSheet(style.read_text(encoding="utf-8"))


def run_app(open_source: str | None = None, demo: bool = False) -> int:
    """Create the QApplication and show the main window; return the exit code.

    Whatever the launch opens, an autosave left by a crashed run is offered first (a bar
    above the tree) and kept untouched until the user answers it.

    Args:
        open_source: a model folder, config.json, saved session, device-map file, bundled
            config name or ``hf-cache:REPO`` (``MainWindow.open_path`` tells them apart).
        demo: open the demo model; it is made (first use only, then cached) on a worker
            thread while the window stays responsive (``workbench.gui.demo_startup``).
    """
    set_windows_app_user_model_id()  # before the QApplication, so the taskbar groups our windows
    app = QApplication.instance() or QApplication(sys.argv)
    configure_application(app)
    workbench_logger = logging.getLogger("workbench")
    if workbench_logger.level == logging.NOTSET:
        workbench_logger.setLevel(logging.INFO)  # the Log tab shows progress lines
    window = MainWindow()
    window.show()
    watch = TerminationWatch(window, window.documents.terminate)  # SIGTERM, Ctrl+C
    pending = app_settings.pending_autosave()
    if pending is not None:  # before anything opens, so nothing autosaves over it
        window.offer_restore(pending)
    if demo:
        start_demo(window)
    elif open_source:
        window.open_path(open_source)
    if not demo and not open_source:
        start_warm_up()  # transformers imports while the user picks a model
    code = app.exec()
    watch.remove()  # the process's own handlers again (a test runs the app in its process)
    # A quit within seconds of the start must not leave the warm-up importing while the
    # interpreter shuts down (a daemon thread inside an import can crash the exit).
    wait_for_warm_up()
    return code
