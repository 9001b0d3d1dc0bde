"""The main window: module tree, device lanes, hardware, planner, undo history, log.

The window observes one ``Session`` (the document) and changes it only through commands on
``undo_stack``. Opening a model runs ``open_model`` on a ``TaskThread`` with a busy indicator,
so the window never freezes. The session is clean after an open and whenever the undo stack
is back at its clean index; closing or replacing unsaved work asks Save / Discard / Cancel
(``window_persistence``). GUI part 2 adds its panels through
``workbench.gui.runtime_panels.install_runtime_panels(window)`` at the end of ``__init__``.

Example:
    >>> window = MainWindow()  # doctest: +SKIP
    >>> window.open_source("llama-3.1-70b")
"""

from __future__ import annotations

import gc
import importlib.util
import logging
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QDragEnterEvent, QDropEvent, QUndoStack
from PySide6.QtWidgets import (
    QDockWidget,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QUndoView,
    QVBoxLayout,
    QWidget,
)

from workbench.big_modeling.devices import device_label, normalize_device
from workbench.gui import settings as app_settings
from workbench.gui.commands import push_move
from workbench.gui.formatting import format_nbytes, format_param_count
from workbench.gui.hardware_selector import BudgetEditor, HardwareSelector
from workbench.gui.lanes import LanesWidget
from workbench.gui.log_view import LogView
from workbench.gui.map_edit import MoveRefused
from workbench.gui.tree_model import ModuleTreeModel
from workbench.gui.tree_view import ModuleTreePanel
from workbench.gui.window_actions import (
    build_actions,
    dropped_paths,
    handle_dropped_path,
    refresh_recent_menu,
    retint_action_icons,
    update_action_states,
)
from workbench.gui.window_hardware import WindowHardwareMixin
from workbench.gui.window_persistence import (
    UnsavedChangesGuard,
    WindowPersistenceMixin,
    model_display_name,
)
from workbench.gui.workers import TaskThread
from workbench.runtime.load_check import LoadCheck, check_load
from workbench.runtime.session import Session, SessionChange
from workbench.wording import plural

logger = logging.getLogger(__name__)


class _SessionSignals(QObject):
    """Turns the session's plain callbacks into a queued-safe Qt signal."""

    changed = Signal(object)


class MainWindow(WindowHardwareMixin, WindowPersistenceMixin, QMainWindow):
    """The workbench's main window.

    Args:
        session: the document to show; a new empty one by default.
        profiles: hardware profiles for the selector (default: detected + bundled + user).
        autosave: write the session to the autosave file after each change (debounced).
    """

    def __init__(
        self,
        session: Session | None = None,
        *,
        profiles: list[Any] | None = None,
        autosave: bool = True,
    ) -> None:
        super().__init__()
        self.setObjectName("mainWindow")
        self.setWindowTitle("Model Memory Workbench")
        self.setAcceptDrops(True)
        self.session = session or Session()
        self.undo_stack = QUndoStack(self)
        self.open_thread: TaskThread | None = None
        self.speed_thread: TaskThread | None = None
        self.speed_prediction: Any = None
        self.load_check: LoadCheck | None = None  # the shared check of the current map
        self._autosave_enabled = autosave
        self._profile: Any = None
        self._pending_map: dict[str, Any] | None = None
        self.restore_bar: QWidget | None = None
        self.save_prompt: Any = None  # the open "Save changes…?" box, if any
        self.unload_prompt: QMessageBox | None = None  # the open "Unload it?" box, if any
        self._close_without_asking = False
        self._show_error = self._show_error_box  # tests replace it to capture messages
        self._show_info = self._show_info_box

        self.tree_model = ModuleTreeModel(self)
        self.tree_panel = ModuleTreePanel(self.tree_model, self)
        self.tree_view = self.tree_panel.view
        self.lanes = LanesWidget(self._move_handler, self)
        self.speed_label = QLabel("Predicted: —", self)
        self.speed_label.setObjectName("speedLabel")
        self.speed_label.setWordWrap(True)
        self.hardware_selector = HardwareSelector(self)
        self.budget_editor = BudgetEditor(self)
        self._build_central()
        self.bottom_tabs = QTabWidget(self)
        self.bottom_tabs.setObjectName("bottomTabs")
        self.log_view = LogView(self)
        self.bottom_tabs.addTab(self.log_view, "Log")
        self.undo_view = QUndoView(self.undo_stack, self)
        self.undo_view.setEmptyLabel("<opened>")
        self._build_docks()
        self._build_status_bar()

        from workbench.gui.planner_panel import PlannerPanel

        self.planner_panel = PlannerPanel(self)
        self.planner_dock.setWidget(_scrolling(self.planner_panel, self))  # fits small screens
        self.actions_by_name = build_actions(self)  # menus, toolbar (main_toolbar), shortcuts
        self.install_session_actions()  # File > Open session…

        self._session_signals = _SessionSignals(self)
        self._session_signals.changed.connect(self._on_session_changed)
        self.undo_stack.cleanChanged.connect(self._on_undo_clean_changed)
        self.tree_view.selectionModel().selectionChanged.connect(
            lambda *_: update_action_states(self)
        )
        self._unsubscribe = self.session.subscribe(self._session_signals.changed.emit)
        self._speed_timer = _single_shot(self, 150, self.update_speed_prediction)
        self._autosave_timer = _single_shot(self, 1000, self.autosave_now)
        self.lanes.move_refused.connect(self._on_lanes_move_refused)
        self.lanes.drag_hint.connect(lambda text: self.statusBar().showMessage(text, 3000))
        self.hardware_selector.profile_chosen.connect(self._on_hardware_profile_chosen)
        self.budget_editor.budgets_edited.connect(self._on_budget_editor_edited)
        self.tree_panel.filter_error.connect(lambda text: self.statusBar().showMessage(text, 5000))

        self._init_hardware(profiles)
        self._restore_window_state()
        self.refresh()
        if importlib.util.find_spec("workbench.gui.runtime_panels") is not None:
            from workbench.gui.runtime_panels import install_runtime_panels

            install_runtime_panels(self)
        # Installed last, so it sees a Close before the other filters on the window (the
        # runtime panels shut the worker down on Close): Cancel leaves everything running.
        self.installEventFilter(UnsavedChangesGuard(self))

    # --- layout -------------------------------------------------------------------------

    def _build_central(self) -> None:
        right = QWidget(self)
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        scroll = QScrollArea(right)
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.lanes)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        right_layout.addWidget(QLabel("<b>Devices</b> — drop modules on a lane", right))
        right_layout.addWidget(scroll, 1)
        right_layout.addWidget(self.speed_label)
        self.main_splitter = QSplitter(Qt.Orientation.Horizontal, self)
        self.main_splitter.setObjectName("mainSplitter")
        self.main_splitter.addWidget(self.tree_panel)
        self.main_splitter.addWidget(right)
        self.main_splitter.setStretchFactor(0, 3)
        self.main_splitter.setStretchFactor(1, 2)
        self.main_splitter.setSizes([560, 440])
        self.setCentralWidget(self.main_splitter)

    def _build_docks(self) -> None:
        # The planner dock runs the full height on the right, so a taller runtime dock never
        # makes the planner form scroll.
        self.setCorner(Qt.Corner.BottomRightCorner, Qt.DockWidgetArea.RightDockWidgetArea)
        self.bottom_dock = self._dock("Runtime", "bottomDock", self.bottom_tabs)
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.bottom_dock)
        self.hardware_dock = self._dock("Budgets", "hardwareDock", self.budget_editor)
        self.history_dock = self._dock("History", "historyDock", self.undo_view)
        self.planner_dock = self._dock("Planner", "plannerDock", QWidget(self))
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.planner_dock)
        self.tabifyDockWidget(self.planner_dock, self.hardware_dock)
        self.tabifyDockWidget(self.hardware_dock, self.history_dock)
        self.planner_dock.raise_()
        self.resizeDocks([self.bottom_dock], [220], Qt.Orientation.Vertical)
        self.resizeDocks([self.planner_dock], [560], Qt.Orientation.Horizontal)

    def _dock(self, title: str, name: str, widget: QWidget) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(name)
        dock.setWidget(widget)
        return dock

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.model_status = QLabel("no model", self)
        self.validity_status = QLabel("", self)
        self.devices_status = QLabel("", self)
        self.busy_bar = QProgressBar(self)
        self.busy_bar.setRange(0, 0)  # indeterminate: a busy indicator
        self.busy_bar.setMaximumWidth(120)
        self.busy_bar.setVisible(False)
        for widget in (self.model_status, self.validity_status, self.devices_status):
            bar.addPermanentWidget(widget)
        bar.addPermanentWidget(self.busy_bar)

    # --- opening ------------------------------------------------------------------------

    def open_source(self, source: str) -> TaskThread | None:
        """Open a config.json, a model folder, a bundled config name or ``hf-cache:REPO``
        on a worker thread; the window shows a busy indicator and stays responsive."""
        if self.open_thread is not None and self.open_thread.isRunning():
            self.statusBar().showMessage("Still opening the previous model…", 3000)
            return None
        from workbench.models import open_model

        thread = TaskThread(open_model, source, dtype=self.session.dtype)
        thread.setObjectName(f"open {source}")
        thread.succeeded.connect(lambda opened: self._on_open_succeeded(source, opened))
        thread.failed.connect(lambda exc: self._on_open_failed(source, exc))
        self.open_thread = thread
        self.busy_bar.setVisible(True)
        self.statusBar().showMessage(f"Opening {source}…")
        logger.info("opening %s", source)
        thread.start()
        return thread

    def _on_open_succeeded(self, source: str, opened: Any) -> None:
        self.busy_bar.setVisible(False)
        pending, self._pending_map = self._pending_map, None
        self.set_opened(source, opened, pending)
        elapsed_s = self.open_thread.elapsed_s if self.open_thread else 0.0
        self.statusBar().showMessage(f"Opened {opened.label} in {elapsed_s:.1f} s", 5000)
        logger.info("opened %s in %.2f s", source, elapsed_s)
        self.after_document_opened()  # a restored session's state, or a map waiting for it

    def _on_open_failed(self, source: str, exc: BaseException) -> None:
        self.busy_bar.setVisible(False)
        self.statusBar().showMessage(f"Could not open {source}", 5000)
        logger.error("could not open %s: %s", source, str(exc))
        self.document_open_failed()
        self._show_error("Could not open the model", str(exc))

    def set_opened(
        self, source: str, opened: Any, device_map: dict[str, Any] | None = None
    ) -> None:
        """Show an opened model; the map starts as ``device_map`` or everything on the first
        device of the profile. Clears the undo history (a new document, clean).

        The model gets a new ``ModelContext`` (``Session.replace_model``): nothing derived from
        the previous model survives. Only the hardware profile carries over: without a
        ``device_map`` (a plain open, not a restore) the budgets are the profile's and the
        reserve is the planner's estimate for this model."""
        self.undo_stack.clear()
        _unfreeze_gc()  # let the previous model's node cycles be collected
        restoring = device_map is not None
        self.session.replace_model(str(source), opened)
        if not restoring and self._profile is not None:
            self.session.set_budgets(self._profile.budgets(), reason="open")
        self.planner_panel.set_model(opened)
        if not restoring:
            self.session.set_reserve(self.planner_panel.reserve_bytes(), reason="open")
        first = next(iter(self.session.budgets), "cpu")
        self.session.set_device_map(device_map or {"": first}, reason="open")
        self.session.mark_clean()
        self.undo_stack.setClean()
        app_settings.add_recent_model(str(source))
        refresh_recent_menu(self)
        self.tree_model.set_tree(self.session.tree, self.session.device_map)
        self.refresh()
        _freeze_gc_for(self.session.tree)

    def confirm_loaded_model(self, then: Any, source: str | None = None) -> QMessageBox | None:
        """Before another model replaces this one: while a model is loaded (or loading) in
        the worker, ask "Unload it?" (window-modal, it does not block) and run ``then`` after
        Unload or Keep loaded; Cancel runs nothing. Kept, the inference panel says Run acts
        on the loaded model, not the one on screen. Not asked when ``source`` (what opens) is
        the loaded model itself, nor again once Keep loaded was the answer for the loaded
        model (until the next load or unload). Returns the box shown, or ``None``."""
        panels = getattr(self, "runtime_panels", None)
        controller = None if panels is None else panels.controller
        if (
            controller is None
            or not (controller.loaded or controller.busy)
            or (not controller.busy and controller.keep_answered)
            or (not controller.busy and controller.is_loaded_source(source))
        ):
            then()
            return None
        if self.unload_prompt is not None:  # already asking
            self.unload_prompt.raise_()
            return self.unload_prompt
        name = model_display_name(controller.loaded_source or self.session.source)
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "A model is loaded",
            f"{name} is {'loading' if controller.busy else 'loaded'} in the worker. "
            "Unload it before opening another model?",
            QMessageBox.StandardButton.Cancel,
            self,
        )
        box.setObjectName("unloadPrompt")
        box.setInformativeText(
            "Unload frees its memory. Keep loaded lets Run and Verify go on using it; the "
            "Inference tab then says it is not the model on screen."
        )
        unload = box.addButton("&Unload", QMessageBox.ButtonRole.AcceptRole)
        box.addButton("&Keep loaded", QMessageBox.ButtonRole.NoRole)
        box.setDefaultButton(unload)
        box.setEscapeButton(QMessageBox.StandardButton.Cancel)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.finished.connect(lambda _result: self._on_unload_prompt_answered(box, unload, then))
        self.unload_prompt = box
        box.open()
        return box

    def _on_unload_prompt_answered(self, box: QMessageBox, unload: Any, then: Any) -> None:
        self.unload_prompt = None
        clicked = box.clickedButton()
        if clicked is None or box.standardButton(clicked) == QMessageBox.StandardButton.Cancel:
            return
        panels = self.runtime_panels
        controller, inference = panels.controller, panels.inference_panel
        if clicked is unload:
            if controller.busy:
                controller.cancel()
            elif inference.busy:  # stop the run first; unload once it has stopped
                panels.bridge.result.connect(self._unload_when_idle)
                panels.bridge.failed.connect(self._unload_when_idle)
                inference.stop()
            else:
                panels.unload_action.trigger()
        elif not controller.busy:  # Keep loaded: not asked again for this loaded model
            controller.keep_answered = True
        then()

    def _unload_when_idle(self, _event: Any) -> None:
        panels = self.runtime_panels
        if panels.inference_panel.busy:  # another job's event; the run is still stopping
            return
        panels.bridge.result.disconnect(self._unload_when_idle)
        panels.bridge.failed.disconnect(self._unload_when_idle)
        panels.controller.unload()

    # --- edits --------------------------------------------------------------------------

    def _move_handler(self, names: list[str], device: int | str) -> str | None:
        if self.session.tree is None:
            return "open a model first"
        try:
            result = push_move(self.undo_stack, self.session, names, device)
        except MoveRefused as exc:
            return str(exc)
        self.statusBar().showMessage(result.describe(), 5000)
        return None

    def move_selection_to(self, device: int | str) -> str | None:
        """Move the selected tree rows to ``device`` (menu, Ctrl+N); return a refusal or None."""
        names = self.tree_panel.view.selected_names()
        if not names:
            self.statusBar().showMessage("Select modules in the tree first", 3000)
            return "nothing selected"
        return self.lanes.request_move(names, normalize_device(device))

    def _on_lanes_move_refused(self, reason: str) -> None:
        self.statusBar().showMessage(f"Refused: {reason}", 8000)
        logger.warning("move refused: %s", reason)

    # --- refresh ------------------------------------------------------------------------

    def _on_session_changed(self, change: SessionChange) -> None:
        if change.what in ("profile", "restored") and self.session.profile is not None:
            self._profile = self.session.profile
            if not self.hardware_selector.select_name(self._profile.name):
                self.hardware_selector.add_profile(self._profile)
        if change.what == "opened":
            self.tree_model.set_tree(self.session.tree, self.session.device_map)
        if change.what in ("device_map", "budgets", "reserve", "profile", "opened", "restored"):
            self.refresh()
            self._speed_timer.start()
        if change.what in ("budgets", "profile", "restored"):
            self.planner_panel.sync_from_session()
            self.remember_hardware()
        if change.what == "dirty":
            if not self.session.dirty:  # saved: undoing from here makes it dirty again
                self.undo_stack.setClean()
            self._update_title()
        elif self._autosave_enabled:
            self._autosave_timer.start()

    def _on_undo_clean_changed(self, clean: bool) -> None:
        if clean:  # undo or redo returned to the state that was opened or saved
            self.session.mark_clean()

    def refresh(self) -> None:
        """Bring the tree's device column, lanes, budgets and status bar up to date."""
        session = self.session
        self.tree_model.set_device_map(session.device_map)
        profile = self._profile
        titles = {spec.device: spec.name for spec in profile.devices} if profile else {}
        budgets = dict(session.budgets)
        self.budget_editor.set_budgets(budgets, titles)
        self.load_check = check_load(session.opened, session.device_map) if session.opened else None
        self.lanes.update_lanes(
            session.tree,
            session.device_map,
            budgets,
            reserve_bytes=session.reserve,
            reserve_device=self.execution_device(),
            titles=titles,
            load_check=self.load_check,
        )
        tree = session.tree
        if tree is None:
            self.model_status.setText("no model — File > Open, or drop a folder here")
        else:
            dtype = str(tree.planning_dtype or "as stored").replace("torch.", "")
            name = model_display_name(session.source)
            self.model_status.setText(
                f"{name} · {format_param_count(tree.root.param_count)} params · "
                f"{format_nbytes(tree.root.nbytes)} {dtype}"
            )
        valid = self.lanes.is_valid
        # INVALID only for a map the loader refuses; a budget problem is one of its own
        text = (
            "map valid" if valid else "map INVALID" if not self.lanes.map_valid else "over budget"
        )
        check = self.load_check
        if valid and check is not None and check.device_problems:
            text += " · cannot load on this machine"
        elif valid and check is not None and check.weight_problems:
            text += " · plan only (no weights)"
        if tree is None:
            text = ""  # no model, no map to call valid
        self.validity_status.setText(text)
        self.validity_status.setToolTip("\n".join(self.lanes.problems + self.lanes.load_notes))
        if self.validity_status.property("invalid") != (not valid):
            self.validity_status.setProperty("invalid", not valid)
            self.validity_status.style().unpolish(self.validity_status)  # re-read the style
            self.validity_status.style().polish(self.validity_status)
        self.devices_status.setText(plural(len(self.lanes.lanes), "device"))
        self._update_title()
        update_action_states(self)

    def _update_title(self) -> None:
        title = "Model Memory Workbench"
        if self.session.tree is not None:
            name = model_display_name(self.session.source)
            title = f"{name}{' *' if self.session.dirty else ''} — {title}"
        self.setWindowTitle(title)

    def execution_device(self) -> int | str:
        """The main execution device (first GPU of the budgets, else cpu): where the reserve goes."""
        gpus = sorted(d for d in self.session.budgets if isinstance(d, int))
        return gpus[0] if gpus else "cpu"

    def changeEvent(self, event: QEvent) -> None:
        """Re-tint the toolbar icons when the system switches between light and dark."""
        if event.type() in (QEvent.Type.ApplicationPaletteChange, QEvent.Type.PaletteChange):
            retint_action_icons(self)
        super().changeEvent(event)

    def closeEvent(self, event: QCloseEvent) -> None:
        """Close for good (``UnsavedChangesGuard`` has asked about unsaved changes already)."""
        self._close_without_asking = False
        self.save_window_state()
        for thread in (self.open_thread, self.planner_panel.thread, self.speed_thread):
            if thread is not None:
                thread.wait()
        self._autosave_timer.stop()
        self._speed_timer.stop()
        if self._autosave_enabled and not self.restore_offer_pending():
            app_settings.discard_autosave()  # unanswered, a crashed run's autosave stays
        self._unsubscribe()
        self.log_view.detach()
        super().closeEvent(event)

    # --- drops onto the window ------------------------------------------------------------

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if dropped_paths(event.mimeData()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event: QDropEvent) -> None:
        paths = dropped_paths(event.mimeData())
        for path in paths[:1]:
            handle_dropped_path(self, path)
        if paths:
            event.acceptProposedAction()


HUGE_TREE_MODULES = 20_000
_gc_frozen = False
_gc_released = False  # unfrozen objects wait for one full collection before the next freeze


def _freeze_gc_for(tree: Any) -> None:
    """Move a huge model's objects out of the cyclic GC's reach (``gc.freeze``).

    A 98k-module meta model is over a million Python objects; every full collection then walks
    them all (seconds), stalling the event loop at random moments. They live as long as the
    document, so freezing them costs nothing; ``_unfreeze_gc`` gives them back to the
    collector when another model replaces it (its nodes form cycles, so only the GC frees them).
    """
    global _gc_frozen, _gc_released
    if tree is not None and len(tree) >= HUGE_TREE_MODULES:
        if _gc_released:  # free the previous model first, or it would be frozen again
            gc.collect()
            _gc_released = False
        gc.freeze()
        _gc_frozen = True


def _unfreeze_gc() -> None:
    global _gc_frozen, _gc_released
    if _gc_frozen:
        gc.unfreeze()
        _gc_frozen, _gc_released = False, True


def _scrolling(widget: QWidget, parent: QWidget) -> QScrollArea:
    scroll = QScrollArea(parent)
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QScrollArea.Shape.NoFrame)
    scroll.setWidget(widget)
    return scroll


def _single_shot(parent: QObject, interval_ms: int, slot: Any) -> QTimer:
    timer = QTimer(parent)
    timer.setSingleShot(True)
    timer.setInterval(interval_ms)
    timer.timeout.connect(slot)
    return timer


__all__ = ["MainWindow", "device_label"]
