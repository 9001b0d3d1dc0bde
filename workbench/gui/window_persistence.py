"""Persistence and dialogs of ``MainWindow``: opening sessions and map files, autosave and
crash recovery, window state, message boxes, and the "Save changes…?" question before unsaved
work is closed or replaced.

Every way of handing the window a path (``workbench PATH``, ``--open``, File > Open session,
a drop, the recent list) goes through :meth:`WindowPersistenceMixin.open_path`, which asks
``workbench.runtime.documents`` what the path is: a session is restored (model, map, budgets,
reserve, profile, planner options; the undo clean point is the restored state), a map file is
imported into the model it was made for, anything else opens as a model.

Crash recovery: while the "Restore it?" bar is unanswered nothing overwrites or removes the
autosave, whatever the launch opened meanwhile; a recovered session counts as changed ("*",
quitting asks), because no file holds it.

A mixin so ``main_window.py`` stays about layout and state; it relies on the window's
``session``, ``open_source``, ``tree_panel``, ``hardware_selector`` and ``main_splitter``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtGui import QAction, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QWidget,
)

from workbench.gui import settings as app_settings
from workbench.runtime.documents import MAP_SUFFIX, SESSION_SUFFIX, classify_document
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
    # set by restore_session_file / open_path, consumed by after_document_opened
    _pending_restore: tuple[Session, bool] | None = None
    _pending_import: Path | None = None

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
        """Open ``source`` (a model, a session or a map file) in place of the current model
        (File > Open, Recent, What-if, a drop), asking first when the current session has
        unsaved changes. A plain map file replaces nothing: it is imported into the open model.
        """
        document = classify_document(source)
        if document.kind == "map" and (self.session.tree is not None or not document.model_source):
            self.open_path(source)
            return
        target = source if document.kind == "model" else document.model_source
        self.confirm_unsaved_changes(
            lambda: self.confirm_loaded_model(  # type: ignore[attr-defined]
                lambda: self.open_path(source), source=target
            )
        )

    def open_path(self, source: str) -> Any:
        """Open ``source`` by what it is (``workbench.runtime.documents``), without asking.

        A session is restored; a map file is imported into the open model (the import dialog
        checks it); with no model open, a wrapped map first opens the model it names, a plain
        one waits for the next model. Anything else opens as a model. Returns the opening
        thread, or the import dialog, or ``None``.
        """
        document = classify_document(source)
        if document.kind == "session":
            return self.restore_session_file(source)
        if document.kind == "map":
            from workbench.gui.map_io import import_device_map

            if self.session.tree is None and document.model_source is not None:
                self._pending_import = Path(source)
                return self.open_source(document.model_source)  # type: ignore[attr-defined]
            if self.session.tree is None:
                self._pending_import = Path(source)
                self.statusBar().showMessage(  # type: ignore[attr-defined]
                    f"{Path(source).name} is a device map: open its model and it is imported"
                )
                return None
            return import_device_map(self, source)  # type: ignore[arg-type]
        return self.open_source(source)  # type: ignore[attr-defined]

    def after_document_opened(self) -> None:
        """Finish what :meth:`open_path` started once the model is shown: apply a restored
        session's state (its clean point), or import the map that was waiting for it."""
        pending, self._pending_restore = self._pending_restore, None
        if pending is not None:
            self._apply_restored_session(*pending)
        waiting, self._pending_import = self._pending_import, None
        if waiting is not None:
            from workbench.gui.map_io import import_device_map

            import_device_map(self, waiting)  # type: ignore[arg-type]

    def document_open_failed(self) -> None:
        """Forget a restore or import that was waiting for a model that did not open."""
        self._pending_restore = None
        self._pending_import = None

    def _close_after_answer(self) -> None:
        self._close_without_asking = True
        self.close()  # type: ignore[attr-defined]

    # --- persistence --------------------------------------------------------------------

    def restore_offer_pending(self) -> bool:
        """True while the "Restore it?" bar waits for an answer: the autosave it offers is
        then neither overwritten nor removed (not even by a clean quit)."""
        return self.restore_bar is not None and not self.restore_bar.isHidden()

    def autosave_now(self) -> None:
        """Write the session to the autosave file now (normally debounced by 1 s).

        Skipped while a restore offer is unanswered: the file holds the crashed run's work.
        """
        self._autosave_timer.stop()
        if self.session.source is None or self.restore_offer_pending():
            return
        try:
            app_settings.write_autosave(self.session.to_dict())
        except (OSError, TypeError, ValueError) as exc:
            logger.warning("autosave failed: %s", str(exc))

    def offer_restore(self, path: Path) -> QWidget:
        """Show a bar offering to restore the autosaved session at ``path`` (non-blocking).

        Until Restore or Discard is clicked the autosave is kept as it is."""
        bar = QWidget(self)
        bar.setObjectName("restoreBar")
        row = QHBoxLayout(bar)
        row.setContentsMargins(6, 2, 6, 2)
        label = QLabel(_restore_question(path), bar)
        label.setWordWrap(True)
        row.addWidget(label, 1)
        restore, discard = QPushButton("&Restore", bar), QPushButton("&Discard", bar)
        restore.setObjectName("restoreButton")
        discard.setObjectName("discardRestoreButton")
        row.addWidget(restore)
        row.addWidget(discard)
        restore.clicked.connect(lambda: self._on_restore_bar_answered(path, restore=True))
        discard.clicked.connect(lambda: self._on_restore_bar_answered(path, restore=False))
        self.tree_panel.layout().insertWidget(0, bar)
        self.restore_bar = bar
        return bar

    def _on_restore_bar_answered(self, path: Path, *, restore: bool) -> None:
        if restore:
            self.confirm_unsaved_changes(lambda: self._restore_answered(path))
            return
        self.restore_bar.hide()  # type: ignore[union-attr]
        app_settings.discard_autosave()
        if self.session.source is not None and self._autosave_enabled:  # type: ignore[attr-defined]
            self._autosave_timer.start()  # the work of this run is autosaved from now on

    def _restore_answered(self, path: Path) -> None:
        self.restore_bar.hide()  # type: ignore[union-attr]
        self.restore_session_file(path, recovered=True)

    def restore_session_file(self, path: str | Path, *, recovered: bool = False) -> Any:
        """Restore a saved or autosaved session: the model and its map (opened on a worker
        thread), then its budgets, reserve, profile and planner options.

        Args:
            path: a file written by ``Session.save`` or the autosave.
            recovered: the autosave of a run that crashed: the result counts as changed
                (no file holds it); otherwise it is clean, saved at ``path``, and the undo
                history's clean point is the restored state.

        Returns:
            The opening thread, or ``None`` when the file cannot be read (an error is shown).
        """
        try:
            saved = Session.restore(path)
        except (OSError, ValueError) as exc:
            self._show_error("Cannot restore the session", str(exc))
            return None
        if not saved.source:
            self._show_error(
                "Cannot restore the session", f"{path}: the session names no model (source)"
            )
            return None
        if classify_document(saved.source).kind == "session":
            self._show_error(
                "Cannot restore the session",
                f"{path}: its source {saved.source} is another session, not a model",
            )
            return None
        if self.session.dtype != saved.dtype:
            self.session.set_dtype(saved.dtype, reason="restore")  # the model opens in it
        self._pending_map = dict(saved.device_map)
        self._pending_restore = (saved, recovered)
        self._pending_import = None
        thread = self.open_source(saved.source)  # type: ignore[attr-defined]
        if thread is None:
            self._pending_restore = None
        return thread

    def _apply_restored_session(self, saved: Session, recovered: bool) -> None:
        """Put the restored state on the freshly opened model, then set the clean point."""
        session = self.session
        if saved.profile is not None:
            self._profile = saved.profile
            self.hardware_selector.add_profile(saved.profile)
            session.set_profile(saved.profile, reason="restore")
        if saved.budgets:
            session.set_budgets(saved.budgets, reason="restore")
        session.set_reserve(saved.reserve, reason="restore")
        session.set_planner_options(saved.planner_options, reason="restore")
        if session.device_map != saved.device_map:
            session.set_device_map(saved.device_map, reason="restore")
        undo_stack = self.undo_stack  # type: ignore[attr-defined]
        undo_stack.clear()
        session.mark_clean()
        undo_stack.setClean()
        if recovered:
            session.path = None
            undo_stack.resetClean()  # undoing never reaches a saved state: there is none
            session.mark_dirty("recovered after a crash")
        else:
            session.path = saved.path
            app_settings.add_recent_model(str(saved.path))
            from workbench.gui.window_actions import refresh_recent_menu

            refresh_recent_menu(self)  # type: ignore[arg-type]
        self.statusBar().showMessage(  # type: ignore[attr-defined]
            "Restored the session of the crashed run: save it to keep it"
            if recovered
            else f"Opened session {Path(str(saved.path)).name}",
            8000,
        )

    # --- File > Open session ------------------------------------------------------------

    def install_session_actions(self) -> QAction:
        """Add File > Open session… (Ctrl+Shift+O) above the recent list; return the action."""
        action = QAction("Open &session…", self)  # type: ignore[arg-type]
        action.setObjectName("openSessionAction")
        action.setShortcut(QKeySequence("Ctrl+Shift+O"))
        tip = "Open a saved session: model, device map, budgets and hardware profile"
        action.setStatusTip(tip)
        action.setToolTip(tip)
        action.triggered.connect(lambda _checked=False: self.open_session_dialog())
        recent = self.recent_menu.menuAction()  # type: ignore[attr-defined]
        for widget in recent.associatedObjects():
            if hasattr(widget, "insertAction"):
                widget.insertAction(recent, action)
        self.actions_by_name["open_session"] = action  # type: ignore[attr-defined]
        return action

    def open_session_dialog(self) -> None:
        """Ask for a session (or map) file and open it (asking about unsaved work first)."""
        path, _ = QFileDialog.getOpenFileName(
            self,  # type: ignore[arg-type]
            "Open session",
            "",
            f"Workbench session (*{SESSION_SUFFIX} *.json);;"
            f"Device map (*{MAP_SUFFIX} *.json);;All files (*)",
        )
        if path:
            self.open_replacing(path)

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
        """A bottom dock tall enough to read the memory plot (three tenths of the window,
        200 to 320 px); a planner dock wide enough for its form, no sideways scroll."""
        bottom = min(320, max(200, self.height() * 3 // 10))
        self.resizeDocks([self.bottom_dock], [bottom], Qt.Orientation.Vertical)
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


def _restore_question(path: Path) -> str:
    """ "The last session did not end cleanly. Restore <model>?" naming the autosaved model."""
    try:
        source = Session.restore(path).source
    except (OSError, ValueError):
        source = None
    what = f"its session for {model_display_name(source)}" if source else "it"
    return (
        f"The last session did not end cleanly. Restore {what}? "
        "(The autosave is kept until you answer.)"
    )


def model_display_name(source: str | None) -> str:
    """A short name for ``source``: the folder or file name (``untitled`` when unset)."""
    if not source:
        return "untitled"
    text = str(source).rstrip("/")
    name = text.rsplit("/", 1)[-1]
    if name == "config.json":
        name = text.rsplit("/", 2)[-2] if text.count("/") >= 1 else name
    return name.removesuffix(".json")
