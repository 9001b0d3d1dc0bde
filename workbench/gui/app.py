"""Start the desktop app. (Placeholder window until the main window lands.)"""

from __future__ import annotations

import sys

from workbench import APP_ID, APP_NAME, __version__


def run_app(open_source: str | None = None, demo: bool = False) -> int:
    """Create the QApplication and show the main window; return the exit code."""
    from PySide6.QtWidgets import QApplication, QLabel

    app = QApplication.instance() or QApplication(sys.argv)
    app.setApplicationName(APP_NAME)
    app.setApplicationVersion(__version__)
    app.setDesktopFileName(APP_ID)
    label = QLabel(f"{APP_NAME} {__version__}")
    label.show()
    return app.exec()
