"""Persistence and dialogs of ``MainWindow``: autosave, restore, window state, message boxes.

A mixin so ``main_window.py`` stays about layout and state; it relies on the window's
``session``, ``open_source``, ``tree_panel``, ``hardware_selector`` and ``main_splitter``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer
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
