"""Persistence and dialogs of ``MainWindow``: autosave, restore, window state, message boxes,
and the "Save changes…?" question before unsaved work is closed or replaced.

A mixin so ``main_window.py`` stays about layout and state; it relies on the window's
``session``, ``open_source``, ``tree_panel``, ``hardware_selector`` and ``main_splitter``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMessageBox, QPushButton, QWidget

from workbench.gui import settings as app_settings
from workbench.runtime.session import Session

logger = logging.getLogger(__name__)


class WindowPersistenceMixin:
    """Autosave, restore after a crash, window geometry, non-blocking message boxes."""

    session: Session
    _autosave_timer: Any
    _pending_map: dict[str, Any] | None
    _profile: Any
    restore_bar: QWidget | None
    save_prompt: QMessageBox | None
    _close_without_asking: bool

    # --- unsaved changes ----------------------------------------------------------------

    def has_unsaved_changes(self) -> bool:
        """True when a model is open and its session changed since it was opened or saved."""
        return self.session.tree is not None and self.session.dirty

    def confirm_unsaved_changes(self, then: Callable[[], object]) -> QMessageBox | None:
        """Run ``then`` now when nothing is unsaved; otherwise ask "Save changes to the session
        for <model>?" in a window-modal box (it does not block) and run ``then`` after Save
        (once the session is saved) or Discard. Cancel runs nothing. Returns the box shown."""
        if not self.has_unsaved_changes():
            then()
            return None
        if self.save_prompt is not None:  # already asking: one question at a time
            self.save_prompt.raise_()
            return self.save_prompt
        buttons = QMessageBox.StandardButton
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Unsaved changes",
            f"Save changes to the session for {model_display_name(self.session.source)}?",
            buttons.Save | buttons.Discard | buttons.Cancel,
            self,  # type: ignore[arg-type]
        )
        box.setObjectName("savePrompt")
        box.setInformativeText(
            "The device map, budgets or hardware changed since the model was opened or saved."
        )
        box.setDefaultButton(buttons.Save)
        box.setEscapeButton(buttons.Cancel)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.finished.connect(lambda _result: self._on_save_prompt_answered(box, then))
        self.save_prompt = box
        box.open()
        return box

    def _on_save_prompt_answered(self, box: QMessageBox, then: Callable[[], object]) -> None:
        self.save_prompt = None
        answer = box.standardButton(box.clickedButton())
        if answer == QMessageBox.StandardButton.Save:
            from workbench.gui.map_io import save_session_dialog

            save_session_dialog(self)  # type: ignore[arg-type]
            if self.session.dirty:  # the file dialog was cancelled or the save failed
                return
        elif answer != QMessageBox.StandardButton.Discard:
            return
        then()

    def open_replacing(self, source: str) -> None:
        """Open ``source`` in place of the current model (File > Open, Recent, What-if, a
        drop), asking first when the current session has unsaved changes."""
        self.confirm_unsaved_changes(lambda: self.open_source(source))  # type: ignore[attr-defined]

    def _close_after_answer(self) -> None:
        self._close_without_asking = True
        self.close()  # type: ignore[attr-defined]

    # --- persistence --------------------------------------------------------------------

    def autosave_now(self) -> None:
        """Write the session to the autosave file now (normally debounced by 1 s)."""
        self._autosave_timer.stop()
        if self.session.source is None:
            return
        try:
            app_settings.write_autosave(self.session.to_dict())
        except (OSError, TypeError, ValueError) as exc:
            logger.warning("autosave failed: %s", str(exc))

    def offer_restore(self, path: Path) -> QWidget:
        """Show a bar offering to restore the autosaved session at ``path`` (non-blocking)."""
        bar = QWidget(self)
        bar.setObjectName("restoreBar")
        row = QHBoxLayout(bar)
        row.setContentsMargins(6, 2, 6, 2)
        row.addWidget(QLabel("The last session did not end cleanly. Restore it?", bar), 1)
        restore, discard = QPushButton("&Restore", bar), QPushButton("&Discard", bar)
        row.addWidget(restore)
        row.addWidget(discard)
        restore.clicked.connect(lambda: (self.restore_session_file(path), bar.hide()))
        discard.clicked.connect(lambda: (app_settings.discard_autosave(), bar.hide()))
        self.tree_panel.layout().insertWidget(0, bar)
        self.restore_bar = bar
        return bar

    def restore_session_file(self, path: str | Path) -> Any:
        """Restore a saved or autosaved session: budgets, reserve, profile, then the model and
        its map (opened on a worker thread)."""
        try:
            saved = Session.restore(path)
        except (OSError, ValueError) as exc:
            self._show_error("Cannot restore the session", str(exc))
            return None
        if saved.profile is not None:
            self._profile = saved.profile
            self.hardware_selector.add_profile(saved.profile)
            self.session.set_profile(saved.profile, reason="restore")
        self.session.set_budgets(saved.budgets or self.session.budgets, reason="restore")
        self.session.set_reserve(saved.reserve, reason="restore")
        self.session.set_planner_options(saved.planner_options, reason="restore")
        self.session.set_dtype(saved.dtype, reason="restore")
        if not saved.source:
            return None
        self._pending_map = dict(saved.device_map)
        return self.open_source(saved.source)

    def _restore_window_state(self) -> None:
        saved = app_settings.window_state(["main"])
        if saved["geometry"] is not None:
            self.restoreGeometry(saved["geometry"])
        else:
            self._first_run_size()
        if saved["state"] is not None:
            self.restoreState(saved["state"])
        else:  # first run: a compact bottom dock once the window has its real size
            QTimer.singleShot(0, self._default_dock_sizes)
        if saved["splitters"]["main"] is not None:
            self.main_splitter.restoreState(saved["splitters"]["main"])

    def _first_run_size(self) -> None:
        """Nine tenths of the screen (at least 1400 x 900 where the screen allows)."""
        screen = self.screen() or QGuiApplication.primaryScreen()
        if screen is None:
            self.resize(1400, 900)
            return
        area = screen.availableGeometry()
        self.resize(
            min(area.width(), max(1400, area.width() * 9 // 10)),
            min(area.height(), max(900, area.height() * 9 // 10)),
        )

    def _default_dock_sizes(self) -> None:
        """A compact bottom dock; a planner dock wide enough for its form, no sideways scroll."""
        self.resizeDocks([self.bottom_dock], [200], Qt.Orientation.Vertical)
        scroll = self.planner_dock.widget()
        needed = (
            self.planner_panel.minimumSizeHint().width()
            + scroll.verticalScrollBar().sizeHint().width()
        )
        width = min(max(560, needed + 8), self.width() // 3)
        self.resizeDocks([self.planner_dock], [width], Qt.Orientation.Horizontal)

    def save_window_state(self) -> None:
        """Remember geometry, docks and splitters (also done on close)."""
        app_settings.save_window_state(
            self.saveGeometry(), self.saveState(), {"main": self.main_splitter.saveState()}
        )

    # --- dialogs (non-blocking; tests replace _show_error / _show_info) ------------------

    def _show_error_box(self, title: str, text: str) -> None:
        box = QMessageBox(
            QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, self
        )
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.setModal(False)
        box.show()

    def _show_info_box(self, title: str, text: str) -> None:
        box = QMessageBox(
            QMessageBox.Icon.Information, title, text, QMessageBox.StandardButton.Ok, self
        )
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.setModal(False)
        box.show()


class UnsavedChangesGuard(QObject):
    """Event filter that turns a window's Close into "Save changes…?" while work is unsaved.

    The close waits for the answer: Save (then closes once saved), Discard (closes), Cancel
    (stays open). Install it last on the window, so it sees the Close before other filters.
    """

    def __init__(self, window: Any) -> None:
        super().__init__(window)
        self._window = window

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        window = self._window
        if (
            watched is window
            and event.type() == QEvent.Type.Close
            and not window._close_without_asking
            and window.has_unsaved_changes()
        ):
            event.ignore()
            window.confirm_unsaved_changes(window._close_after_answer)
            return True
        return False


def model_display_name(source: str | None) -> str:
    """A short name for ``source``: the folder or file name (``untitled`` when unset)."""
    if not source:
        return "untitled"
    text = str(source).rstrip("/")
    name = text.rsplit("/", 1)[-1]
    if name == "config.json":
        name = text.rsplit("/", 2)[-2] if text.count("/") >= 1 else name
    return name.removesuffix(".json")
