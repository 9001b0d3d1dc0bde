"""Menus, the main toolbar, keyboard shortcuts and the tree's context menu of ``MainWindow``.

Kept apart from ``main_window.py`` so the window file stays about layout and state. Every
action is reachable from the keyboard; Ctrl+1..9 move the selected rows to lane 1..9. Each of
those shortcuts belongs to exactly one ``QAction`` of the window, which Edit > Move selection to
and the tree's context menu reuse (a second action with the same shortcut would make Qt call
the key ambiguous and do nothing).

Actions that need a model are disabled, with a tooltip saying so, until one is open; the Move
menus also wait for a selection (``update_action_states``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import shiboken6
from PySide6.QtCore import QMimeData, QObject, QPoint, Qt, Slot
from PySide6.QtGui import QAction, QGuiApplication, QKeySequence
from PySide6.QtWidgets import QFileDialog, QMenu, QToolBar, QToolButton

from workbench.big_modeling.devices import device_label
from workbench.big_modeling.errors import BadInputError
from workbench.gui import settings as app_settings
from workbench.gui.icons import icon

if TYPE_CHECKING:
    from workbench.gui.main_window import MainWindow

MAX_LANE_SHORTCUTS = 9
MODEL_ACTIONS = (
    "export_map",
    "export_wrapped",
    "copy_code",
    "plan",
    "compare",
    "diff_file",
    "diff_history",
)
NEEDS_MODEL = "Open a model first (File > Open)"
NEEDS_SELECTION = "Select modules in the tree first"
ENABLED_TIP_PROPERTY = "workbenchEnabledTip"

ICON_NAME_PROPERTY = "workbenchIconName"


def set_action_icon(action: QAction, name: str) -> None:
    """Give ``action`` the palette-tinted icon ``name`` and remember the name for re-tinting."""
    action.setProperty(ICON_NAME_PROPERTY, name)
    action.setIcon(icon(name))


def retint_action_icons(window: Any) -> None:
    """Tint every named action icon of ``window`` anew for the current palette."""
    for action in window.findChildren(QAction):
        name = action.property(ICON_NAME_PROPERTY)
        if name:
            action.setIcon(icon(name))


def _action(
    window: MainWindow,
    text: str,
    slot: Any,
    *,
    shortcut: Any = None,
    icon_name: str | None = None,
    tip: str = "",
) -> QAction:
    action = QAction(text, window)
    if shortcut is not None:
        action.setShortcut(QKeySequence(shortcut))
    if icon_name:
        set_action_icon(action, icon_name)
    if tip:
        action.setStatusTip(tip)
        action.setToolTip(tip)
    action.triggered.connect(lambda _checked=False: slot())
    return action


def _show_cluster_plan(window: MainWindow) -> None:
    from workbench.gui.cluster_view import show_cluster_plan

    show_cluster_plan(window)


def build_actions(window: MainWindow) -> dict[str, QAction]:
    """Create menus, the ``main_toolbar`` and shortcuts; return the actions by name."""
    from workbench.gui import map_io
    from workbench.gui.diff_dialog import show_diff_against_file, show_diff_against_history

    actions = {
        "open_config": _action(
            window,
            "&Open config or folder…",
            lambda: open_dialog(window),
            shortcut=QKeySequence.StandardKey.Open,
            icon_name="open",
            tip="Open a config.json or a model folder",
        ),
        "open_folder": _action(window, "Open model &folder…", lambda: open_folder_dialog(window)),
        "hf_cache": _action(
            window, "Hugging Face &cache…", lambda: show_cache_browser(window), icon_name="cache"
        ),
        "import_map": _action(
            window,
            "&Import device map…",
            lambda: map_io.import_dialog(window),
            shortcut="Ctrl+I",
            icon_name="import-map",
            tip="Import a device-map JSON (validated before anything changes)",
        ),
        "export_map": _action(
            window,
            "&Export device map…",
            lambda: map_io.export_dialog(window),
            shortcut="Ctrl+E",
            icon_name="export-map",
            tip="Export the map in the transformers/Accelerate format",
        ),
        "export_wrapped": _action(
            window,
            "Export map with model &fingerprint…",
            lambda: map_io.export_dialog(window, wrapped=True),
        ),
        "copy_code": _action(
            window,
            "Copy as &code",
            lambda: map_io.copy_as_code(window),
            shortcut="Ctrl+Shift+C",
            icon_name="copy-code",
            tip="Copy a from_pretrained(device_map=..., max_memory=...) snippet",
        ),
        "save_session": _action(
            window,
            "&Save session as…",
            lambda: map_io.save_session_dialog(window),
            shortcut=QKeySequence.StandardKey.Save,
            icon_name="save",
        ),
        # Ctrl+Q spelled out: the offscreen and some X11 themes bind no StandardKey.Quit
        "quit": _action(window, "&Quit", window.close, shortcut="Ctrl+Q"),
        "plan": _action(
            window,
            "&Plan",
            lambda: plan_now(window),
            shortcut="Ctrl+P",
            icon_name="plan",
            tip="Plan with the current strategy and apply it (one undo step)",
        ),
        "compare": _action(
            window,
            "&Compare strategies…",
            lambda: _show_dock(window.planner_dock),
            tip="Show the Planner panel: compare every strategy side by side, apply one",
        ),
        "diff_file": _action(
            window,
            "&Diff against map file…",
            lambda: show_diff_against_file(window),
            icon_name="diff",
            tip="Compare the current map with a map file",
        ),
        "diff_history": _action(
            window,
            "Diff against &earlier state",
            lambda: show_diff_against_history(window),
            tip="Compare the current map with a state from the history",
        ),
        "filter": _action(
            window,
            "&Find module",
            window.tree_panel.filter_edit.setFocus,
            shortcut=QKeySequence.StandardKey.Find,
        ),
        "expand": _action(
            window,
            "E&xpand to depth",
            window.tree_panel.expand_button.click,
            shortcut="Ctrl+Shift+E",
        ),
    }
    undo = window.undo_stack.createUndoAction(window, "&Undo")
    undo.setShortcut(QKeySequence.StandardKey.Undo)
    set_action_icon(undo, "undo")
    redo = window.undo_stack.createRedoAction(window, "&Redo")
    # Ctrl+Shift+Z everywhere, plus the platform's Redo keys; each key once (the platform's
    # list may hold Ctrl+Shift+Z already, and a key listed twice is "ambiguous": it does nothing)
    redo.setShortcuts(
        _unique_keys(
            [QKeySequence("Ctrl+Shift+Z"), *QKeySequence.keyBindings(QKeySequence.StandardKey.Redo)]
        )
    )
    set_action_icon(redo, "redo")
    _short_button_text(undo, "Undo", window.undo_stack.undoTextChanged)
    _short_button_text(redo, "Redo", window.undo_stack.redoTextChanged)
    actions["undo"], actions["redo"] = undo, redo
    for name in MODEL_ACTIONS:
        actions[name].setProperty(ENABLED_TIP_PROPERTY, actions[name].toolTip())

    bar = window.menuBar()
    file_menu = bar.addMenu("&File")
    for name in ("open_config", "open_folder", "hf_cache"):
        file_menu.addAction(actions[name])
    window.whatif_menu = file_menu.addMenu("&What-if model")
    _fill_whatif_menu(window)
    window.recent_menu = file_menu.addMenu("&Recent models")
    file_menu.addSeparator()
    for name in ("import_map", "export_map", "export_wrapped", "copy_code"):
        file_menu.addAction(actions[name])
    file_menu.addSeparator()
    file_menu.addAction(actions["save_session"])
    file_menu.addAction(actions["quit"])

    edit_menu = bar.addMenu("&Edit")
    edit_menu.addAction(undo)
    edit_menu.addAction(redo)
    edit_menu.addSeparator()
    window.move_menu = edit_menu.addMenu("&Move selection to")
    window.move_menu.setToolTipsVisible(True)
    edit_menu.setToolTipsVisible(True)
    window.move_menu.aboutToShow.connect(lambda: _fill_move_menu(window, window.move_menu))
    for number in range(1, MAX_LANE_SHORTCUTS + 1):
        lane_action = _action(
            window,
            f"Move selection to lane {number}",
            lambda n=number: _move_to_lane(window, n),
            shortcut=f"Ctrl+{number}",
        )
        window.addAction(lane_action)
        actions[f"lane_{number}"] = lane_action

    view_menu = bar.addMenu("&View")
    view_menu.addAction(actions["filter"])
    view_menu.addAction(actions["expand"])
    view_menu.addSeparator()
    for dock in (
        window.planner_dock,
        window.hardware_dock,
        window.history_dock,
        window.bottom_dock,
    ):
        view_menu.addAction(dock.toggleViewAction())

    file_menu.setToolTipsVisible(True)
    tools_menu = bar.addMenu("&Tools")
    tools_menu.setToolTipsVisible(True)
    for name in ("plan", "compare", "diff_file", "diff_history"):
        tools_menu.addAction(actions[name])
    actions["cluster_plan"] = _action(
        window,
        "C&luster plan…",
        lambda: _show_cluster_plan(window),
        tip="Plan the model across a cluster (TP x PP), compare candidates, export launch scripts",
    )
    tools_menu.addAction(actions["cluster_plan"])

    toolbar = QToolBar("Main", window)
    toolbar.setObjectName("mainToolbar")
    toolbar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
    toolbar.addAction(actions["open_config"])
    toolbar.addWidget(window.hardware_selector)
    toolbar.addAction(actions["plan"])
    toolbar.addSeparator()
    for name in ("import_map", "export_map", "copy_code", "diff_file"):
        toolbar.addAction(actions[name])
        _icon_only(toolbar, actions[name])  # secondary: the tooltip names them
    toolbar.addSeparator()
    toolbar.addAction(undo)
    toolbar.addAction(redo)
    window.addToolBar(Qt.ToolBarArea.TopToolBarArea, toolbar)
    window.main_toolbar = toolbar

    window.tree_view.customContextMenuRequested.connect(lambda pos: _tree_context_menu(window, pos))
    refresh_recent_menu(window)
    return actions


def _unique_keys(sequences: list[QKeySequence]) -> list[QKeySequence]:
    """``sequences`` without repeats, in order (``QKeySequence`` compares by keys)."""
    unique: list[QKeySequence] = []
    for sequence in sequences:
        if not sequence.isEmpty() and sequence not in unique:
            unique.append(sequence)
    return unique


def plan_now(window: MainWindow) -> None:
    """Plan with the current strategy and apply the result as one undo step (Plan, Ctrl+P);
    the Planner panel shows the plan and its "Why" list, and still compares every strategy."""
    _show_dock(window.planner_dock)
    window.planner_panel.plan_and_apply()


def _short_button_text(action: QAction, verb: str, text_changed: Any) -> None:
    """Keep a toolbar button at ``verb`` while the menu entry names the command ("Undo Move
    'norm' to disk"); the tooltip names it too, so the toolbar does not grow with the name."""
    action.setIconText(verb)
    tip = _CommandTip(action, verb)
    text_changed.connect(tip.follow)  # a QObject slot: disconnected when the action goes
    tip.follow("")


class _CommandTip(QObject):
    """Writes "Undo <command> (Ctrl+Z)" into its parent action's tooltip."""

    def __init__(self, action: QAction, verb: str) -> None:
        super().__init__(action)
        self._action, self._verb = action, verb

    @Slot(str)
    def follow(self, command: str) -> None:
        verb, action = self._verb, self._action
        if not shiboken6.isValid(action):  # the stack clears itself while the window goes
            return
        shortcut = action.shortcut().toString(QKeySequence.SequenceFormat.NativeText)
        what = f"{verb} {command}" if command else f"Nothing to {verb.lower()}"
        action.setToolTip(f"{what} ({shortcut})" if shortcut else what)


def _icon_only(toolbar: QToolBar, action: QAction) -> None:
    button = toolbar.widgetForAction(action)
    if isinstance(button, QToolButton):
        button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)


def update_action_states(window: MainWindow) -> None:
    """Enable the actions that need a model only while one is open (their tooltip says why
    when disabled); Edit > Move selection to also needs selected rows."""
    actions = getattr(window, "actions_by_name", None)
    if not actions:
        return
    has_model = window.session.tree is not None
    for name in MODEL_ACTIONS:
        _enable(actions[name], has_model, NEEDS_MODEL)
    for number in range(1, MAX_LANE_SHORTCUTS + 1):
        actions[f"lane_{number}"].setEnabled(has_model)
    selected = has_model and bool(window.tree_view.selectionModel().hasSelection())
    _enable(
        window.move_menu.menuAction(),
        selected,
        NEEDS_SELECTION if has_model else NEEDS_MODEL,
    )


def _enable(action: QAction, enabled: bool, reason: str) -> None:
    """Enable ``action``, or disable it with ``reason`` as its tooltip and status tip."""
    tip = action.property(ENABLED_TIP_PROPERTY) or ""
    action.setEnabled(enabled)
    shown = tip if enabled else (f"{tip} — {reason}" if tip else reason)
    action.setToolTip(shown or action.text().replace("&", ""))
    action.setStatusTip(shown)


def _show_dock(dock: Any) -> None:
    dock.show()
    dock.raise_()


def _fill_whatif_menu(window: MainWindow) -> None:
    try:
        from workbench.models.catalog import list_bundled_configs

        entries = list_bundled_configs()
    except Exception:  # the catalog is optional for the window to work
        entries = []
    for entry in entries:
        action = window.whatif_menu.addAction(entry.name)
        action.setToolTip(f"{entry.architecture} ({entry.model_type}), shapes only, no weights")
        action.triggered.connect(lambda _c=False, p=str(entry.path): window.open_replacing(p))


def refresh_recent_menu(window: MainWindow) -> None:
    """Rebuild File > Recent models from the settings."""
    menu = window.recent_menu
    menu.clear()
    recents = app_settings.recent_models()
    for source in recents:
        action = menu.addAction(source)
        action.triggered.connect(lambda _c=False, s=source: window.open_replacing(s))
    menu.setEnabled(bool(recents))


def _fill_move_menu(window: MainWindow, menu: QMenu) -> None:
    menu.clear()  # keeps the window's lane actions (the menu does not own them)
    for number, lane in enumerate(window.lanes.lanes, start=1):
        if number <= MAX_LANE_SHORTCUTS:
            action = window.actions_by_name[f"lane_{number}"]
            action.setText(device_label(lane.device))
            menu.addAction(action)
            continue
        action = menu.addAction(device_label(lane.device))
        action.triggered.connect(lambda _c=False, d=lane.device: window.move_selection_to(d))


def _move_to_lane(window: MainWindow, number: int) -> None:
    lanes = window.lanes.lanes
    if number <= len(lanes):
        window.move_selection_to(lanes[number - 1].device)


def _tree_context_menu(window: MainWindow, pos: QPoint) -> QMenu:
    menu = QMenu(window)
    menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    menu.setToolTipsVisible(True)
    move_menu = menu.addMenu("Move to")
    _fill_move_menu(window, move_menu)
    names = window.tree_view.selected_names()
    has_model = window.session.tree is not None
    _enable(
        move_menu.menuAction(),
        has_model and bool(names),
        NEEDS_SELECTION if has_model else NEEDS_MODEL,
    )
    copy = menu.addAction("Copy name")
    copy.setEnabled(bool(names))
    copy.triggered.connect(lambda: QGuiApplication.clipboard().setText("\n".join(names)))
    expand = menu.addAction("Expand all below")
    index = window.tree_view.indexAt(pos)
    expand.setEnabled(index.isValid())
    expand.triggered.connect(lambda: window.tree_view.expandRecursively(index))
    menu.popup(window.tree_view.viewport().mapToGlobal(pos))
    return menu


def open_dialog(window: MainWindow) -> None:
    """One dialog for a config file or a model folder (see ``gui.open_dialog``)."""
    from workbench.gui.open_dialog import open_model_dialog

    open_model_dialog(window).chosen.connect(window.open_replacing)


def open_folder_dialog(window: MainWindow) -> None:
    path = QFileDialog.getExistingDirectory(window, "Open model folder")
    if path:
        window.open_replacing(path)


def show_cache_browser(window: MainWindow) -> None:
    """List models in the local Hugging Face cache (offline); double-click opens one."""
    from workbench.gui.cache_browser import CacheBrowser

    browser = CacheBrowser(window)
    browser.chosen.connect(window.open_replacing)
    browser.show()


def dropped_paths(mime: QMimeData) -> list[Path]:
    """Local files or folders in a drop (config.json, model folders, device-map JSON)."""
    if not mime.hasUrls():
        return []
    return [Path(url.toLocalFile()) for url in mime.urls() if url.isLocalFile()]


def handle_dropped_path(window: MainWindow, path: Path) -> None:
    """A folder or ``config.json`` opens a model, a session file is restored; any other
    ``.json`` is imported as a map."""
    from workbench.gui import map_io
    from workbench.runtime.documents import classify_document

    if path.is_dir() or path.name == "config.json" or _looks_like_config(path):
        window.open_replacing(str(path))
    elif classify_document(path).kind in ("session", "map"):
        window.open_replacing(str(path))  # a session is restored, a map imported
    elif path.suffix == ".json":
        map_io.import_device_map(window, path)
    else:
        window._show_error(
            "Cannot use this file",
            f"{path}: drop a model folder, a config.json or a device-map .json",
        )


def _looks_like_config(path: Path) -> bool:
    """True for a transformers config saved under another name (it names a ``model_type``)."""
    if path.suffix != ".json" or not path.is_file() or path.stat().st_size > 1_000_000:
        return False
    from workbench.big_modeling.json_files import read_json

    try:
        data = read_json(path, what="a model config", fix="", max_nbytes=1_000_000)
    except (OSError, BadInputError):  # deep, huge-integer or broken JSON: not a config
        return False
    return isinstance(data, dict) and ("model_type" in data or "architectures" in data)
