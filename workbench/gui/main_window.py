"""The main window: module tree, device lanes, hardware, planner, undo history, log.

The window observes one ``Session`` (the document) and changes it only through commands on
``undo_stack``. Opening a model runs ``open_model`` on a ``TaskThread`` with a busy indicator,
so the window never freezes. The session is clean after an open and whenever the undo stack
is back at its clean index; closing or replacing unsaved work asks Save / Discard / Cancel.

The window is composed, not extended: ``__init__`` builds every panel (the runtime panels
included), the actions come from the registry in ``workbench.gui.actions``, and its parts
(``hardware``: profile and speed, ``documents``: sessions, autosave and recovery,
``runtime_panels``: load, plots, inference) receive what they need, never the window class.

Example:
    >>> window = MainWindow()  # doctest: +SKIP
    >>> window.open_source("llama-3.1-70b")
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QDragEnterEvent, QDropEvent, QGuiApplication, QUndoStack
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

from workbench.gui import map_io
from workbench.gui import settings as app_settings
from workbench.gui.actions import (
    MAX_LANE_SHORTCUTS,
    MENUS,
    TOOLBAR,
    ActionSet,
    WindowState,
    follow_command_text,
    retint_action_icons,
)
from workbench.gui.bridge import WorkerBridge
from workbench.gui.cluster_view import show_cluster_plan
from workbench.gui.commands import push_move
from workbench.gui.convert_action import GGUFConversion
from workbench.gui.diff_dialog import show_diff_against_file, show_diff_against_history
from workbench.gui.fit_dialog import show_fit_table
from workbench.gui.hardware_selector import BudgetEditor, HardwareSelector
from workbench.gui.lanes import LanesWidget
from workbench.gui.log_view import LogView
from workbench.gui.measure_machine import measure_machine_again
from workbench.gui.planner_panel import PlannerPanel
from workbench.gui.runtime_panels import RuntimePanels
from workbench.gui.tree_model import ModuleTreeModel
from workbench.gui.tree_view import ModuleTreePanel
from workbench.gui.window_actions import (
    dropped_paths,
    fill_move_menu,
    fill_whatif_menu,
    handle_dropped_path,
    open_dialog,
    open_folder_dialog,
    refresh_recent_menu,
    show_cache_browser,
    tree_context_menu,
)
from workbench.gui.window_context import MessageSink
from workbench.gui.window_hardware import WindowHardware
from workbench.gui.window_persistence import (
    SessionDocuments,
    UnsavedChangesGuard,
    model_display_name,
    show_message,
)
from workbench.gui.workers import TaskThread
from workbench.models import open_model
from workbench.runtime import dtype_name, normalize_device
from workbench.runtime.formatting import format_nbytes, format_param_count
from workbench.runtime.load_check import LoadCheck, check_load
from workbench.runtime.map_edits import MoveRefused
from workbench.runtime.precision_session import planned_nbytes, planned_tree
from workbench.runtime.session import Session, SessionChange
from workbench.wording import plural

logger = logging.getLogger(__name__)
# the session changes the lanes and the status bar show
_REFRESHING_CHANGES = (
    "device_map",
    "budgets",
    "reserve",
    "profile",
    "opened",
    "restored",
    "precision_map",
)


class _SessionSignals(QObject):
    """Turns the session's plain callbacks into a queued-safe Qt signal."""

    changed = Signal(object)


class MainWindow(QMainWindow):
    """The workbench's main window.

    Args:
        session: the document to show; a new empty one by default.
        profiles: hardware profiles for the selector (default: detected + bundled + user).
        autosave: write the session to the autosave file after each change (debounced).
        bridge: the runtime panels' worker bridge (default: a new one around a worker process).
        warm_worker: start the worker in the background once a model is open (default: unless
            ``$WORKBENCH_WARM_WORKER`` is ``0``).
        show_error: shows an error ``(title, text)`` (default: a non-blocking message box).
        show_info: shows a notice ``(title, text)`` (default: a non-blocking message box).

    Attributes:
        hardware: the profile, budgets and speed prediction (``WindowHardware``).
        documents: opening, restoring and autosaving sessions (``SessionDocuments``).
        runtime_panels: load & dispatch, the live plots, inference (``RuntimePanels``).
        actions_by_name: every ``QAction`` of ``workbench.gui.actions.ACTIONS`` by id.
    """

    def __init__(
        self,
        session: Session | None = None,
        *,
        profiles: list[Any] | None = None,
        autosave: bool = True,
        bridge: WorkerBridge | None = None,
        warm_worker: bool | None = None,
        show_error: MessageSink | None = None,
        show_info: MessageSink | None = None,
    ) -> None:
        super().__init__()
        self.setObjectName("mainWindow")
        self.setWindowTitle("Model Memory Workbench")
        self.setAcceptDrops(True)
        self.session = session or Session()
        self.undo_stack = QUndoStack(self)
        self.open_thread: TaskThread | None = None
        self.load_check: LoadCheck | None = None  # the shared check of the current map
        self.unload_prompt: QMessageBox | None = None  # the open "Unload it?" box, if any
        self.show_error: MessageSink = show_error or self._show_error_box
        self.show_info: MessageSink = show_info or self._show_info_box

        self.tree_model = ModuleTreeModel(self)
        self.tree_panel = ModuleTreePanel(self.tree_model, self)
        self.tree_view = self.tree_panel.view
        self.lanes = LanesWidget(self._move_handler, self)
        self.speed_label = QLabel("Predicted: —", self)
        self.speed_label.setObjectName("speedLabel")
        self.speed_label.setWordWrap(True)
        self.hardware_selector = HardwareSelector(self)
        self.budget_editor = BudgetEditor(self)
        self.hardware = WindowHardware(
            self,
            self.session,
            self.undo_stack,
            self.hardware_selector,
            self.speed_label,
            fit_problems=lambda: self.lanes.budget_problems,
        )
        self.documents = SessionDocuments(self, self._place_restore_bar, autosave=autosave)
        self._build_central()
        self.bottom_tabs = QTabWidget(self)
        self.bottom_tabs.setObjectName("bottomTabs")
        self.log_view = LogView(self)
        self.bottom_tabs.addTab(self.log_view, "Log")
        self.undo_view = QUndoView(self.undo_stack, self)
        self.undo_view.setEmptyLabel("<opened>")
        self._build_docks()
        self.planner_panel = PlannerPanel(self)
        self.planner_dock.setWidget(_scrolling(self.planner_panel, self))  # fits small screens
        self.hardware.list_profiles(profiles)  # the runtime panels look the detected one up
        self.runtime_panels = RuntimePanels(
            self,
            self.session,
            self.hardware_profile,
            known_profile=self.hardware_selector.profile,
            bridge=bridge,
            warm_on_open=warm_worker,
        )
        self._build_runtime_tabs()
        self._build_status_bar()
        self.gguf_conversion = GGUFConversion(self)  # Tools > Convert for loading
        self.action_set = self._build_actions()
        self.actions_by_name = self.action_set.actions
        self.main_toolbar = self.action_set.build_toolbar(
            TOOLBAR, {"hardware_selector": self.hardware_selector}
        )

        self._session_signals = _SessionSignals(self)
        self._session_signals.changed.connect(self._on_session_changed)
        self.undo_stack.cleanChanged.connect(self._on_undo_clean_changed)
        self.tree_view.selectionModel().selectionChanged.connect(lambda *_: self.refresh_actions())
        self.tree_view.customContextMenuRequested.connect(self._show_tree_context_menu)
        self._unsubscribe = self.session.subscribe(self._session_signals.changed.emit)
        self.lanes.move_refused.connect(self._on_lanes_move_refused)
        self.lanes.drag_hint.connect(lambda text: self.statusBar().showMessage(text, 3000))
        self.runtime_panels.inference_panel.run_finished.connect(
            lambda _record: self.hardware.refresh_after_run()
        )
        self.planner_panel.comparison_ready.connect(
            lambda _candidates: self.hardware.refresh_after_run()
        )
        self.runtime_panels.inference_panel.memory_view.record_shown.connect(
            self.lanes.show_measured  # measured beside predicted in the lane tooltips
        )
        self.budget_editor.budgets_edited.connect(self.edit_budgets)
        self.tree_panel.filter_error.connect(lambda text: self.statusBar().showMessage(text, 5000))

        self.hardware.choose_first_profile()
        self._restore_window_state()
        self.refresh()
        self.installEventFilter(self.runtime_panels)  # shuts the worker down on Close
        # Installed last, so it sees a Close before the other filters on the window (the
        # runtime panels shut the worker down on Close): Cancel leaves everything running.
        self.installEventFilter(UnsavedChangesGuard(self.documents))

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
        self.main_splitter.setSizes([600, 400])  # the tree's columns, the lanes' bars
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

    def _build_runtime_tabs(self) -> None:
        panels, tabs = self.runtime_panels, self.bottom_tabs
        tabs.insertTab(0, panels.memory_plot, "Memory")
        tabs.insertTab(1, panels.transfer_plot, "Transfers")
        tabs.insertTab(2, panels.inference_panel, "Inference")
        tabs.setCurrentIndex(0)

    def _build_actions(self) -> ActionSet:
        """The registry's actions with this window's handlers, its menus and its toolbar."""
        panels, stack = self.runtime_panels, self.undo_stack
        undo = stack.createUndoAction(self, "&Undo")
        redo = stack.createRedoAction(self, "&Redo")
        handlers: dict[str, Callable[[], object]] = {
            "open_config": lambda: open_dialog(self, self.open_replacing),
            "open_folder": lambda: open_folder_dialog(self, self.open_replacing),
            "hf_cache": lambda: show_cache_browser(self, self.open_replacing),
            "open_session": self.documents.open_session_dialog,
            "import_map": lambda: map_io.import_dialog(self),
            "export_map": lambda: map_io.export_dialog(self),
            "export_wrapped": lambda: map_io.export_dialog(self, wrapped=True),
            "copy_code": lambda: map_io.copy_as_code(self),
            "save_session": lambda: map_io.save_session_dialog(self),
            "quit": self.close,
            "filter": self.tree_panel.filter_edit.setFocus,
            "expand": self.tree_panel.expand_button.click,
            "plan": self.plan_now,
            "compare": lambda: _show_dock(self.planner_dock),
            "diff_file": lambda: show_diff_against_file(self),
            "diff_history": lambda: show_diff_against_history(self),
            "cluster_plan": lambda: show_cluster_plan(self),
            "fit_table": lambda: show_fit_table(self),
            "measure_machine": lambda: measure_machine_again(self),
        }
        for number in range(1, MAX_LANE_SHORTCUTS + 1):
            handlers[f"lane_{number}"] = lambda n=number: self._move_to_lane(n)
        actions = ActionSet(
            self,
            handlers,
            provided={
                "undo": undo,
                "redo": redo,
                "load_dispatch": panels.load_action,
                "cancel": panels.cancel_action,
                "unload": panels.unload_action,
                "convert_gguf": self.gguf_conversion.action,
            },
        )
        follow_command_text(undo, "Undo", stack.undoTextChanged)
        follow_command_text(redo, "Redo", stack.redoTextChanged)
        docks = (self.planner_dock, self.hardware_dock, self.history_dock, self.bottom_dock)
        actions.build_menus(MENUS, [dock.toggleViewAction() for dock in docks])
        self.whatif_menu = actions.submenus["whatif_menu"]
        self.recent_menu = actions.submenus["recent_menu"]
        self.move_menu = actions.submenus["move_menu"]
        self.move_menu.aboutToShow.connect(lambda: self._fill_move_menu(self.move_menu))
        fill_whatif_menu(self.whatif_menu, self.open_replacing)
        self.refresh_recent_menu()
        return actions

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        bar.addPermanentWidget(self.runtime_panels.progress_widget)
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
        self.set_opened(source, opened, self.documents.take_pending_map())
        elapsed_s = self.open_thread.elapsed_s if self.open_thread else 0.0
        self.statusBar().showMessage(f"Opened {opened.label} in {elapsed_s:.1f} s", 5000)
        logger.info("opened %s in %.2f s", source, elapsed_s)
        self.documents.after_document_opened()  # a restored session's state, or a waiting map

    def _on_open_failed(self, source: str, exc: BaseException) -> None:
        self.busy_bar.setVisible(False)
        self.statusBar().showMessage(f"Could not open {source}", 5000)
        logger.error("could not open %s: %s", source, str(exc))
        self.documents.document_open_failed()
        self.show_error("Could not open the model", str(exc))

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
        profile = self.hardware.profile
        if not restoring and profile is not None:
            self.session.set_budgets(profile.budgets(), reason="open")
        self.planner_panel.set_model(opened)
        if not restoring:
            self.session.set_reserve(self.planner_panel.reserve_bytes(), reason="open")
            self.session.set_memory(self.planner_panel.memory_options(), reason="open")
        first = next(iter(self.session.budgets), "cpu")
        self.session.set_device_map(device_map or {"": first}, reason="open")
        self.session.mark_clean()
        self.undo_stack.setClean()
        app_settings.add_recent_model(str(source))
        self.refresh_recent_menu()
        self.tree_model.set_tree(self.session.tree, self.session.device_map, gguf=self._gguf())
        self.refresh()
        _freeze_gc_for(self.session.tree)

    def confirm_loaded_model(self, then: Any, source: str | None = None) -> QMessageBox | None:
        """Before another model replaces this one: while a model is loaded (or loading) in
        the worker, ask "Unload it?" (window-modal, it does not block) and run ``then`` after
        Unload or Keep loaded; Cancel runs nothing. Kept, the inference panel says Run acts
        on the loaded model, not the one on screen. Not asked when ``source`` (what opens) is
        the loaded model itself, nor again once Keep loaded was the answer for the loaded
        model (until the next load or unload). Returns the box shown, or ``None``."""
        controller = self.runtime_panels.controller
        if (
            not (controller.loaded or controller.busy)
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

    def _move_to_lane(self, number: int) -> None:
        lanes = self.lanes.lanes
        if number <= len(lanes):
            self.move_selection_to(lanes[number - 1].device)

    def _fill_move_menu(self, menu: Any) -> None:
        devices = [lane.device for lane in self.lanes.lanes]
        fill_move_menu(menu, devices, self.actions_by_name, self.move_selection_to)

    def _show_tree_context_menu(self, pos: Any) -> Any:
        return tree_context_menu(
            self, self.tree_view, pos, self.window_state(), self._fill_move_menu
        )

    def plan_now(self) -> None:
        """Plan with the current strategy and apply the result as one undo step (Plan, Ctrl+P);
        the Planner panel shows the plan and its "Why" list, and still compares every strategy."""
        _show_dock(self.planner_dock)
        self.planner_panel.plan_and_apply()

    def edit_budgets(self, budgets: dict[int | str, int]) -> None:
        """Set the budgets (the Budgets dock or the Planner's editor) as one undo step."""
        self.hardware.edit_budgets(budgets)

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
            self.hardware.adopt_profile(self.session.profile, replace=False)
        if change.what == "opened":
            self.tree_model.set_tree(self.session.tree, self.session.device_map, gguf=self._gguf())
        if change.what in ("precision_map", "opened", "restored"):
            self.tree_model.set_precision_map(
                self.session.precision_map, planned_nbytes(self.session)
            )
            self.tree_view.viewport().update()  # rows below the top level show it too
        if change.what in _REFRESHING_CHANGES:
            self.refresh()
            self.hardware.speed_timer.start()
        if change.what in ("budgets", "profile", "restored"):
            self.planner_panel.sync_from_session()
            self.hardware.remember_hardware()
        if change.what == "memory" and change.reason == "restore" and self.session.memory:
            # a saved session's memory options (files from before them hold none)
            self.planner_panel.reserve_controls.set_memory_options(self.session.memory)
        if change.what == "dirty":
            if not self.session.dirty:  # saved: undoing from here makes it dirty again
                self.undo_stack.setClean()
            self._update_title()
        elif self.documents.autosave_enabled:
            self.documents.autosave_timer.start()

    def _on_undo_clean_changed(self, clean: bool) -> None:
        if clean:  # undo or redo returned to the state that was opened or saved
            self.session.mark_clean()

    def refresh(self) -> None:
        """Bring the tree's device column, lanes, budgets and status bar up to date."""
        session = self.session
        self.tree_model.set_device_map(session.device_map)
        profile = self.hardware.profile
        titles = {spec.device: spec.name for spec in profile.devices} if profile else {}
        budgets = dict(session.budgets)
        self.budget_editor.set_budgets(budgets, titles)
        self.load_check = check_load(session.opened, session.device_map) if session.opened else None
        self.lanes.update_lanes(
            planned_tree(session),  # the bytes at the session's precisions
            session.device_map,
            budgets,
            reserve_bytes=session.reserve,
            reserve_device=self.execution_device(),
            titles=titles,
            load_check=self.load_check,
            reserves=self.planner_panel.lane_reserves(session.device_map),
        )
        tree = session.tree
        if tree is None:
            self.model_status.setText("no model — File > Open, or drop a folder here")
        else:
            dtype = dtype_name(tree.planning_dtype)
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
        self.refresh_actions()

    def _gguf(self) -> Any:
        """The open model's GGUF header, or ``None`` when it was not opened from a GGUF."""
        return getattr(self.session.opened, "gguf", None)

    def window_state(self) -> WindowState:
        """What the actions' enabled states depend on (a model, a selection)."""
        has_model = self.session.tree is not None
        selected = has_model and bool(self.tree_view.selectionModel().hasSelection())
        return WindowState(has_model=has_model, has_selection=selected)

    def refresh_actions(self) -> None:
        """Enable the actions that need a model or a selection (tooltips say why not)."""
        self.action_set.refresh(self.window_state())

    def refresh_recent_menu(self) -> None:
        """Rebuild File > Recent models from the settings."""
        refresh_recent_menu(self.recent_menu, self.open_replacing)

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

    # --- the parts: hardware and documents ----------------------------------------------

    def hardware_profile(self) -> Any:
        """Return the active ``HardwareProfile`` (what the lanes and the speed model use)."""
        return self.hardware.profile

    def set_hardware_profile(self, profile: Any) -> None:
        """Switch to ``profile``: its budgets replace the current ones (one undo step)."""
        self.hardware.set_hardware_profile(profile)

    def adopt_profile(self, profile: Any) -> None:
        """Make a restored session's ``profile`` the active one (listed and selected)."""
        self.hardware.adopt_profile(profile)

    @property
    def speed_prediction(self) -> Any:
        """The last speed prediction shown, or ``None``."""
        return self.hardware.speed_prediction

    @property
    def speed_thread(self) -> TaskThread | None:
        """The running or last speed-prediction thread."""
        return self.hardware.speed_thread

    def update_speed_prediction(self, *, wait: bool = False) -> None:
        """Recompute tokens/s and TTFT for the current map on a worker thread.

        Args:
            wait: block until the prediction is shown (scripts and benchmarks).
        """
        self.hardware.update_speed_prediction(wait=wait)

    def open_replacing(self, source: str) -> None:
        """Open ``source`` (a model, a session or a map file) in place of the current model,
        asking first about unsaved changes (``SessionDocuments.open_replacing``)."""
        self.documents.open_replacing(source)

    def open_path(self, source: str) -> Any:
        """Open ``source`` by what it is, without asking (``SessionDocuments.open_path``)."""
        return self.documents.open_path(source)

    def restore_session_file(self, path: Any, *, recovered: bool = False) -> Any:
        """Restore a saved or autosaved session (``SessionDocuments.restore_session_file``)."""
        return self.documents.restore_session_file(path, recovered=recovered)

    def offer_restore(self, path: Any) -> QWidget:
        """Offer to restore the autosave at ``path`` in a bar above the tree (non-blocking)."""
        return self.documents.offer_restore(path)

    def autosave_now(self) -> None:
        """Write the session to the autosave file now (normally debounced by 1 s)."""
        self.documents.autosave_now()

    def has_unsaved_changes(self) -> bool:
        """True when a model is open and its session changed since it was opened or saved."""
        return self.documents.has_unsaved_changes()

    def confirm_unsaved_changes(self, then: Callable[[], object]) -> QMessageBox | None:
        """Run ``then`` now, or after "Save changes…?" is answered Save or Discard."""
        return self.documents.confirm_unsaved_changes(then)

    def _place_restore_bar(self, bar: QWidget) -> None:
        self.tree_panel.layout().insertWidget(0, bar)

    # --- window state and message boxes -------------------------------------------------

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
        """A bottom dock tall enough to read the memory plot and a chat with its figures (a
        third of the window, 220 to 340 px); a planner dock wide enough for its form, no
        sideways scroll."""
        bottom = min(340, max(220, self.height() // 3))
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

    def _show_error_box(self, title: str, text: str) -> None:
        show_message(self, QMessageBox.Icon.Warning, title, text)

    def _show_info_box(self, title: str, text: str) -> None:
        show_message(self, QMessageBox.Icon.Information, title, text)

    def changeEvent(self, event: QEvent) -> None:
        """Re-tint the toolbar icons when the system switches between light and dark."""
        if event.type() in (QEvent.Type.ApplicationPaletteChange, QEvent.Type.PaletteChange):
            retint_action_icons(self)
        super().changeEvent(event)

    def closeEvent(self, event: QCloseEvent) -> None:
        """Close for good (``UnsavedChangesGuard`` has asked about unsaved changes already)."""
        documents = self.documents
        documents.close_without_asking = False
        self.save_window_state()
        for thread in (self.open_thread, self.planner_panel.thread, self.hardware.speed_thread):
            if thread is not None:
                thread.wait()
        documents.autosave_timer.stop()
        self.hardware.speed_timer.stop()
        keep = documents.restore_offer_pending() or documents.keep_autosave
        if documents.autosave_enabled and not keep:
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


def _show_dock(dock: QDockWidget) -> None:
    dock.show()
    dock.raise_()


__all__ = ["MainWindow"]
