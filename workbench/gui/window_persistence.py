"""The window's documents: opening sessions and map files, autosave and crash recovery,
message boxes, and the "Save changes…?" question before unsaved work is closed or replaced.

Every way of handing the window a path (``workbench PATH``, ``--open``, File > Open session,
a drop, the recent list) goes through :meth:`SessionDocuments.open_path`, which asks
``workbench.runtime.documents`` what the path is: a session is restored (model, map, budgets,
reserve and memory options, profile, planner options, precision map; the undo clean point is the restored
state), a map file is imported into the model it was made for, anything else opens as a model.

Crash recovery: while the "Restore it?" bar is unanswered nothing overwrites or removes the
autosave, whatever the launch opened meanwhile; a recovered session counts as changed ("*",
quitting asks), because no file holds it.

``SessionDocuments`` is a part of the window, not a base class: it receives a
``DocumentHost`` (the window's session, undo stack, opening and messages), so it never imports
the window.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QWidget,
)

from workbench.gui import settings as app_settings
from workbench.gui.map_io import import_device_map, save_session_dialog
from workbench.gui.window_context import DocumentHost
from workbench.runtime.documents import MAP_SUFFIX, SESSION_SUFFIX, classify_document
from workbench.runtime.session import Session

logger = logging.getLogger(__name__)


class SessionDocuments(QObject):
    """Opening, restoring and autosaving the window's session; the unsaved-changes question.

    Args:
        host: the window (its session, undo stack, opening, messages; the parent of boxes).
        place_bar: puts the "Restore it?" bar into the window (above the tree).
        autosave: write the session to the autosave file after each change (debounced 1 s).

    Attributes:
        save_prompt: the open "Save changes…?" box, if any.
        restore_bar: the "Restore it?" bar, once offered.
        pending_map: the map a restored session opens its model with.
        pending_restore: a restored session waiting for its model to open.
        pending_import: a map file waiting for its model to open.
        keep_autosave: the window closes with unsaved work (``terminate``): its autosave stays
            for the next start to offer.
    """

    def __init__(
        self, host: DocumentHost, place_bar: Callable[[QWidget], None], *, autosave: bool = True
    ) -> None:
        super().__init__(host)  # type: ignore[arg-type]  # the host is the window
        self.host = host
        self._place_bar = place_bar
        self.autosave_enabled = autosave
        self.save_prompt: QMessageBox | None = None
        self.restore_bar: QWidget | None = None
        self.pending_map: dict[str, Any] | None = None
        self.pending_restore: tuple[Session, bool] | None = None
        self.pending_import: Path | None = None
        self.close_without_asking = False
        self.keep_autosave = False
        self.autosave_timer = QTimer(self)
        self.autosave_timer.setSingleShot(True)
        self.autosave_timer.setInterval(1000)
        self.autosave_timer.timeout.connect(self.autosave_now)

    @property
    def session(self) -> Session:
        """The window's session (the document)."""
        return self.host.session

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
            self.host,  # type: ignore[arg-type]
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
            save_session_dialog(self.host)  # type: ignore[arg-type]
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
            lambda: self.host.confirm_loaded_model(lambda: self.open_path(source), source=target)
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
            if self.session.tree is None and document.model_source is not None:
                self.pending_import = Path(source)
                return self.host.open_source(document.model_source)
            if self.session.tree is None:
                self.pending_import = Path(source)
                self.host.statusBar().showMessage(
                    f"{Path(source).name} is a device map: open its model and it is imported"
                )
                return None
            return import_device_map(self.host, source)  # type: ignore[arg-type]
        return self.host.open_source(source)

    def after_document_opened(self) -> None:
        """Finish what :meth:`open_path` started once the model is shown: apply a restored
        session's state (its clean point), or import the map that was waiting for it."""
        pending, self.pending_restore = self.pending_restore, None
        if pending is not None:
            self._apply_restored_session(*pending)
        waiting, self.pending_import = self.pending_import, None
        if waiting is not None:
            import_device_map(self.host, waiting)  # type: ignore[arg-type]

    def document_open_failed(self) -> None:
        """Forget a restore or import that was waiting for a model that did not open."""
        self.pending_restore = None
        self.pending_import = None

    def take_pending_map(self) -> dict[str, Any] | None:
        """The map a restored session opens its model with (once), or ``None``."""
        pending, self.pending_map = self.pending_map, None
        return pending

    def _close_after_answer(self) -> None:
        self.close_without_asking = True
        self.host.close()

    def terminate(self, signal_name: str = "SIGTERM") -> None:
        """Close the window because the system asked (SIGTERM, SIGINT: ``termination``):
        without asking about unsaved changes, which go to the autosave and stay there for the
        next start to offer (``keep_autosave``), saying which signal closed the window; with
        nothing unsaved the exit is clean."""
        if self.has_unsaved_changes():
            if self.autosave_now():  # not while the autosave holds an offered crash's work
                app_settings.set_autosave_closed_by(signal_name)
            self.keep_autosave = True
        if self.save_prompt is not None:  # a Save changes? box waiting: no one will answer it
            self.save_prompt.close()
        self.close_without_asking = True
        self.host.close()

    # --- persistence --------------------------------------------------------------------

    def restore_offer_pending(self) -> bool:
        """True while the "Restore it?" bar waits for an answer: the autosave it offers is
        then neither overwritten nor removed (not even by a clean quit)."""
        return self.restore_bar is not None and not self.restore_bar.isHidden()

    def autosave_now(self) -> bool:
        """Write the session to the autosave file now (normally debounced by 1 s); return
        whether it was written.

        Skipped while a restore offer is unanswered: the file holds the crashed run's work.
        """
        self.autosave_timer.stop()
        if self.session.source is None or self.restore_offer_pending():
            return False
        try:
            app_settings.write_autosave(self.session.to_dict())
        except (OSError, TypeError, ValueError) as exc:
            logger.warning("autosave failed: %s", str(exc))
            return False
        return True

    def offer_restore(self, path: Path) -> QWidget:
        """Show a bar offering to restore the autosaved session at ``path`` (non-blocking).

        Until Restore or Discard is clicked the autosave is kept as it is."""
        bar = QWidget(self.host)  # type: ignore[arg-type]
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
        self._place_bar(bar)
        self.restore_bar = bar
        return bar

    def _on_restore_bar_answered(self, path: Path, *, restore: bool) -> None:
        if restore:
            self.confirm_unsaved_changes(lambda: self._restore_answered(path))
            return
        self.restore_bar.hide()  # type: ignore[union-attr]
        app_settings.discard_autosave()
        if self.session.source is not None and self.autosave_enabled:
            self.autosave_timer.start()  # the work of this run is autosaved from now on

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
        show_error = self.host.show_error
        try:
            saved = Session.restore(path)
        except (OSError, ValueError) as exc:
            show_error("Cannot restore the session", str(exc))
            return None
        if not saved.source:
            show_error("Cannot restore the session", f"{path}: the session names no model (source)")
            return None
        if classify_document(saved.source).kind == "session":
            show_error(
                "Cannot restore the session",
                f"{path}: its source {saved.source} is another session, not a model",
            )
            return None
        if self.session.dtype != saved.dtype:
            self.session.set_dtype(saved.dtype, reason="restore")  # the model opens in it
        self.pending_map = dict(saved.device_map)
        self.pending_restore = (saved, recovered)
        self.pending_import = None
        thread = self.host.open_source(saved.source)
        if thread is None:
            self.pending_restore = None
        return thread

    def _apply_restored_session(self, saved: Session, recovered: bool) -> None:
        """Put the restored state on the freshly opened model, then set the clean point."""
        session = self.session
        if saved.profile is not None:
            self.host.adopt_profile(saved.profile)
            session.set_profile(saved.profile, reason="restore")
        if saved.budgets:
            session.set_budgets(saved.budgets, reason="restore")
        session.set_reserve(saved.reserve, reason="restore")
        session.set_memory(saved.memory, reason="restore")  # None in files from before
        session.set_planner_options(saved.planner_options, reason="restore")
        session.set_precision_map(saved.precision_map, reason="restore")
        if session.device_map != saved.device_map:
            session.set_device_map(saved.device_map, reason="restore")
        undo_stack = self.host.undo_stack
        undo_stack.clear()
        session.mark_clean()
        undo_stack.setClean()
        if recovered:
            session.path = None
            undo_stack.resetClean()  # undoing never reaches a saved state: there is none
            session.mark_dirty("recovered after a crash")
        else:
            session.path = saved.path
            app_settings.add_recent_model(str(saved.path), app_settings.RECENT_SESSIONS_KEY)
            self.host.refresh_recent_menu()
        self.host.statusBar().showMessage(
            "Restored the session of the crashed run: save it to keep it"
            if recovered
            else f"Opened session {Path(str(saved.path)).name}",
            8000,
        )

    # --- File > Open session ------------------------------------------------------------

    def open_session_dialog(self) -> None:
        """Ask for a session (or map) file and open it (asking about unsaved work first)."""
        path, _ = QFileDialog.getOpenFileName(
            self.host,  # type: ignore[arg-type]
            "Open session",
            "",
            f"Workbench session (*{SESSION_SUFFIX} *.json);;"
            f"Device map (*{MAP_SUFFIX} *.json);;All files (*)",
        )
        if path:
            self.open_replacing(path)


def show_message(parent: QWidget, icon: QMessageBox.Icon, title: str, text: str) -> QMessageBox:
    """Show a non-blocking message box over ``parent`` (it deletes itself when closed)."""
    box = QMessageBox(icon, title, text, QMessageBox.StandardButton.Ok, parent)
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.setModal(False)
    box.show()
    return box


class UnsavedChangesGuard(QObject):
    """Event filter that turns a window's Close into "Save changes…?" while work is unsaved.

    The close waits for the answer: Save (then closes once saved), Discard (closes), Cancel
    (stays open). Install it last on the window, so it sees the Close before other filters.
    """

    def __init__(self, documents: SessionDocuments) -> None:
        super().__init__(documents)
        self._documents = documents

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        documents = self._documents
        if (
            watched is documents.host
            and event.type() == QEvent.Type.Close
            and not documents.close_without_asking
            and documents.has_unsaved_changes()
        ):
            event.ignore()
            documents.confirm_unsaved_changes(documents._close_after_answer)
            return True
        return False


def _restore_question(path: Path) -> str:
    """ "The last session did not end cleanly. Restore <model>?" naming the autosaved model;
    "The last session was closed by SIGTERM with unsaved changes." when a signal closed it
    (``terminate``)."""
    try:
        source = Session.restore(path).source
    except (OSError, ValueError):
        source = None
    what = f"its session for {model_display_name(source)}" if source else "it"
    closed_by = app_settings.autosave_closed_by()
    how = f"was closed by {closed_by} with unsaved changes" if closed_by else "did not end cleanly"
    return f"The last session {how}. Restore {what}? (The autosave is kept until you answer.)"


def model_display_name(source: str | None) -> str:
    """A short name for ``source``: the folder or file name (``untitled`` when unset)."""
    if not source:
        return "untitled"
    text = str(source).rstrip("/")
    name = text.rsplit("/", 1)[-1]
    if name == "config.json":
        name = text.rsplit("/", 2)[-2] if text.count("/") >= 1 else name
    return name.removesuffix(".json")
