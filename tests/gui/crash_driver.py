"""A real app process for the crash-recovery tests: ``python crash_driver.py MODE ARGS...``.

Runs ``workbench.cli.main(ARGS)`` (the same code as the ``workbench`` script) with a timer that
acts as the user once the window is up, and reports on stdout, one JSON line per step:

- ``edit``: once a model is open, move ``model.layers.0`` to disk through the undo stack (as
  a drop does), force the autosave, print ``{"step": "edited", ...}`` and keep running, so
  the test can ``kill -9`` it with the work only in the autosave.
- ``idle``: once a model is open, print ``{"step": "idle", ...}`` and keep running (nothing
  unsaved), for the tests that end the app with a signal.
- ``inspect``: once the window is up (and its model open, for a launch that opens one), force
  an autosave as the debounce timer would, print what the restore offer and the autosave file
  look like, click Restore, and once the restored model is shown print its title, dirty flag
  and map, then quit through the window's own close (which asks, because a recovered session
  counts as changed: the answer is printed too).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> int:
    mode, *argv = sys.argv[1:]
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QLabel, QMessageBox, QPushButton

    app = QApplication.instance() or QApplication(sys.argv[:1])
    from workbench.gui import settings as app_settings
    from workbench.gui.commands import push_move
    from workbench.gui.main_window import MainWindow

    expects_model = bool(argv)
    state: dict[str, Any] = {"step": "start"}

    def report(**fields: Any) -> None:
        print(json.dumps(fields), flush=True)

    def window() -> MainWindow | None:
        shown = [w for w in app.topLevelWidgets() if isinstance(w, MainWindow) and w.isVisible()]
        return shown[0] if shown else None

    def opening(w: MainWindow) -> bool:
        return w.open_thread is not None and w.open_thread.isRunning()

    def on_tick() -> None:
        w = window()
        if w is None or opening(w):
            return
        if mode == "idle" and state["step"] == "start" and w.session.tree is not None:
            state["step"] = "idle"
            report(step="idle", dirty=w.session.dirty)
        elif mode == "edit" and state["step"] == "start" and w.session.tree is not None:
            push_move(w.undo_stack, w.session, ["model.layers.0"], "disk")
            w.autosave_now()
            state["step"] = "edited"
            report(step="edited", device_map=w.session.device_map)
        elif mode == "inspect" and state["step"] == "start":
            if expects_model and w.session.tree is None:
                return
            bar = w.documents.restore_bar
            before = app_settings.autosave_path().read_text(encoding="utf-8")
            w.autosave_now()  # what the 1 s debounce would do after the launch's own open
            after = app_settings.autosave_path().read_text(encoding="utf-8")
            report(
                step="launched",
                offered=bar is not None and not bar.isHidden(),
                question=" ".join(label.text() for label in bar.findChildren(QLabel))
                if bar is not None
                else "",
                autosave_kept=before == after,
                source=w.session.source,
            )
            if bar is None:
                app.exit(1)
                return
            state["step"] = "restoring"
            state["before"] = w.session.opened
            w.session.mark_clean()  # the launch's own model holds no work to ask about
            bar.findChild(QPushButton, "restoreButton").click()
        elif state["step"] == "restoring" and w.session.opened is not state["before"]:
            state["step"] = "closing"
            report(
                step="restored",
                title=w.windowTitle(),
                dirty=w.session.dirty,
                device_map=w.session.device_map,
                pending=app_settings.pending_autosave() is not None,
            )
            w.close()  # a recovered session is unsaved work: the window asks first
        elif state["step"] == "closing" and w.documents.save_prompt is not None:
            report(step="asked", text=w.documents.save_prompt.text())
            w.documents.save_prompt.button(QMessageBox.StandardButton.Discard).click()
            app.exit(0)

    timer = QTimer(app)
    timer.setInterval(20)
    timer.timeout.connect(on_tick)
    timer.start()
    from workbench.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
