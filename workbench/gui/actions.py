"""The main window's actions, declared as data: what exists, where it shows, when it is enabled.

``ACTIONS`` lists every window action as an ``ActionSpec`` (id, text, shortcut, icon, tip,
enabled-when); ``MENUS`` and ``TOOLBAR`` say where they go. ``ActionSet`` turns the specs into
``QAction`` objects (one builder), fills the menu bar and the toolbar from the layout, and
recomputes every enabled state in one place (``ActionSet.refresh``) from a small
``WindowState``. What an action *does* is not here: the window passes one handler per id.

Every action is reachable from the keyboard; Ctrl+1..9 move the selected rows to lane 1..9.
Each of those shortcuts belongs to exactly one ``QAction`` of the window, which Edit > Move
selection to and the tree's context menu reuse (a second action with the same shortcut would
make Qt call the key ambiguous and do nothing). Actions that need a model are disabled, with a
tooltip saying so, until one is open; the Move menus also wait for a selection.

Example:
    >>> actions = ActionSet(window, handlers, provided={"undo": undo})  # doctest: +SKIP
    >>> actions.refresh(WindowState(has_model=True, has_selection=False))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import shiboken6
from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu, QToolBar, QToolButton, QWidget

from workbench.gui.icons import icon

Shortcut = str | QKeySequence.StandardKey
MAX_LANE_SHORTCUTS = 9
NEEDS_MODEL = "Open a model first (File > Open)"
NEEDS_SELECTION = "Select modules in the tree first"
ICON_NAME_PROPERTY = "workbenchIconName"
SEPARATOR = "-"


@dataclass(frozen=True)
class WindowState:
    """What enabled states depend on: an open model, selected tree rows."""

    has_model: bool
    has_selection: bool


def needs_model(state: WindowState) -> bool:
    """Enabled while a model is open."""
    return state.has_model


def needs_selection(state: WindowState) -> bool:
    """Enabled while a model is open and tree rows are selected."""
    return state.has_model and state.has_selection


def disabled_reason(state: WindowState) -> str:
    """Why a selection action is disabled: no model yet, or no selected rows."""
    return NEEDS_SELECTION if state.has_model else NEEDS_MODEL


@dataclass(frozen=True)
class ActionSpec:
    """One window action.

    Attributes:
        id: the key in ``ActionSet.actions`` (and in the handlers passed to it).
        text: the menu text, with its ``&`` mnemonic.
        shortcuts: key sequences, the first one primary; each key once. A standard key is
            its platform's primary sequence, or all of its sequences with ``platform_keys``.
        icon: a palette-tinted icon name (``workbench.gui.icons``), re-tinted on theme changes.
        tip: tooltip and status tip; when ``enabled_when`` fails, the reason is appended.
        enabled_when: a predicate over ``WindowState``; ``None``: always enabled, or managed
            by the object that provides the action (the runtime panels, the undo stack).
        explain_disabled: append the disabled reason to the tooltip (menu and toolbar actions).
        icon_only: on the toolbar, show only the icon (secondary actions: the tooltip names them).
        object_name: the ``QObject`` name, for actions that tests or styles look up.
        window_wide: added to the window itself, so its shortcut works with no menu showing it.
    """

    id: str
    text: str
    shortcuts: tuple[Shortcut, ...] = ()
    icon: str = ""
    tip: str = ""
    enabled_when: Callable[[WindowState], bool] | None = None
    explain_disabled: bool = True
    icon_only: bool = False
    object_name: str = ""
    window_wide: bool = False
    platform_keys: bool = False


@dataclass(frozen=True)
class SubmenuSpec:
    """A submenu inside a menu; ``enabled_when`` as for actions (its tooltip explains)."""

    id: str
    title: str
    enabled_when: Callable[[WindowState], bool] | None = None


@dataclass(frozen=True)
class MenuSpec:
    """A menu of the menu bar: action ids, ``SEPARATOR``, ``SubmenuSpec`` entries or
    ``("docks",)``, the dock toggles (placed by the window)."""

    title: str
    items: tuple[str | SubmenuSpec, ...]


def _lane_spec(number: int) -> ActionSpec:
    return ActionSpec(
        f"lane_{number}",
        f"Move selection to lane {number}",
        (f"Ctrl+{number}",),
        enabled_when=needs_model,
        explain_disabled=False,
        window_wide=True,
    )


ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec(
        "open_config",
        "&Open config or folder…",
        (QKeySequence.StandardKey.Open,),
        icon="open",
        tip="Open a config.json or a model folder",
    ),
    ActionSpec("open_folder", "Open model &folder…"),
    ActionSpec("hf_cache", "Hugging Face &cache…", icon="cache"),
    ActionSpec(
        "open_session",
        "Open &session…",
        ("Ctrl+Shift+O",),
        tip="Open a saved session: model, device map, budgets and hardware profile",
        object_name="openSessionAction",
    ),
    ActionSpec(
        "import_map",
        "&Import device map…",
        ("Ctrl+I",),
        icon="import-map",
        tip="Import a device-map JSON (validated before anything changes)",
        icon_only=True,
    ),
    ActionSpec(
        "export_map",
        "&Export device map…",
        ("Ctrl+E",),
        icon="export-map",
        tip="Export the map in the transformers/Accelerate format",
        enabled_when=needs_model,
        icon_only=True,
    ),
    ActionSpec("export_wrapped", "Export map with model &fingerprint…", enabled_when=needs_model),
    ActionSpec(
        "copy_code",
        "Copy as &code",
        ("Ctrl+Shift+C",),
        icon="copy-code",
        tip="Copy a from_pretrained(device_map=..., max_memory=...) snippet",
        enabled_when=needs_model,
        icon_only=True,
    ),
    ActionSpec("save_session", "&Save session as…", (QKeySequence.StandardKey.Save,), icon="save"),
    # Ctrl+Q spelled out: the offscreen and some X11 themes bind no StandardKey.Quit
    ActionSpec("quit", "&Quit", ("Ctrl+Q",)),
    # undo and redo come from the undo stack; their tooltips name the command
    ActionSpec("undo", "&Undo", (QKeySequence.StandardKey.Undo,), icon="undo"),
    # Ctrl+Shift+Z everywhere, plus the platform's Redo keys (each key once)
    ActionSpec(
        "redo",
        "&Redo",
        ("Ctrl+Shift+Z", QKeySequence.StandardKey.Redo),
        icon="redo",
        platform_keys=True,
    ),
    *(_lane_spec(number) for number in range(1, MAX_LANE_SHORTCUTS + 1)),
    ActionSpec("filter", "&Find module", (QKeySequence.StandardKey.Find,)),
    ActionSpec("expand", "E&xpand to depth", ("Ctrl+Shift+E",)),
    ActionSpec(
        "plan",
        "&Plan",
        ("Ctrl+P",),
        icon="plan",
        tip="Plan with the current strategy and apply it (one undo step)",
        enabled_when=needs_model,
    ),
    ActionSpec(
        "compare",
        "&Compare strategies…",
        tip="Show the Planner panel: compare every strategy side by side, apply one",
        enabled_when=needs_model,
    ),
    ActionSpec(
        "fit_table",
        "What &fits where…",
        tip="Every hardware profile by context length: full GPU, partial offload, CPU only "
        "or does not fit, with predicted tok/s and TTFT; double-click one to use it",
        enabled_when=needs_model,
        object_name="fitTableAction",
    ),
    ActionSpec(
        "measure_machine",
        "&Measure this machine again…",
        tip="Take this machine's dispatch, CPU matmul and kernel measurements again (they are "
        "measured once and cached; the detected profile's predictions use them)",
        object_name="measureMachineAction",
    ),
    ActionSpec(
        "diff_file",
        "&Diff against map file…",
        icon="diff",
        tip="Compare the current map with a map file",
        enabled_when=needs_model,
        icon_only=True,
    ),
    ActionSpec(
        "diff_history",
        "Diff against &earlier state",
        tip="Compare the current map with a state from the history",
        enabled_when=needs_model,
    ),
    ActionSpec(
        "cluster_plan",
        "C&luster plan…",
        tip="Plan the model across a cluster (TP x PP), compare candidates, export launch scripts",
    ),
    # provided by the runtime panels, which keep their enabled state (what the worker does)
    ActionSpec("load_dispatch", "Load && dispatch"),
    ActionSpec("cancel", "Cancel"),
    ActionSpec("unload", "Unload"),
    # provided by workbench.gui.convert_action (enabled while a .gguf is open and idle)
    ActionSpec("convert_gguf", "Con&vert for loading"),
)
"""Every action of the main window."""

MOVE_SUBMENU = SubmenuSpec("move_menu", "&Move selection to", enabled_when=needs_selection)
DOCKS = "docks"
MENUS: tuple[MenuSpec, ...] = (
    MenuSpec(
        "&File",
        (
            "open_config",
            "open_folder",
            "hf_cache",
            SubmenuSpec("whatif_menu", "&What-if model"),
            "open_session",
            SubmenuSpec("recent_menu", "&Recent models"),
            SEPARATOR,
            "import_map",
            "export_map",
            "export_wrapped",
            "copy_code",
            SEPARATOR,
            "save_session",
            "quit",
        ),
    ),
    MenuSpec("&Edit", ("undo", "redo", SEPARATOR, MOVE_SUBMENU)),
    MenuSpec("&View", ("filter", "expand", SEPARATOR, DOCKS)),
    MenuSpec(
        "&Tools",
        (
            "plan",
            "compare",
            "fit_table",
            "measure_machine",
            "diff_file",
            "diff_history",
            "cluster_plan",
            SEPARATOR,
            "convert_gguf",
        ),
    ),
)
"""The menu bar, left to right."""

HARDWARE_SELECTOR = "hardware_selector"
TOOLBAR: tuple[str, ...] = (
    "open_config",
    HARDWARE_SELECTOR,
    "plan",
    SEPARATOR,
    "import_map",
    "export_map",
    "copy_code",
    "diff_file",
    SEPARATOR,
    "undo",
    "redo",
    SEPARATOR,
    "convert_gguf",
    "load_dispatch",
    "cancel",
    "unload",
)
"""The main toolbar, left to right (``HARDWARE_SELECTOR``: the window's profile selector)."""

SPECS_BY_ID: dict[str, ActionSpec] = {spec.id: spec for spec in ACTIONS}


def set_action_icon(action: QAction, name: str) -> None:
    """Give ``action`` the palette-tinted icon ``name`` and remember the name for re-tinting."""
    action.setProperty(ICON_NAME_PROPERTY, name)
    action.setIcon(icon(name))


def retint_action_icons(root: QObject) -> None:
    """Tint every named action icon under ``root`` anew for the current palette."""
    for action in root.findChildren(QAction):
        name = action.property(ICON_NAME_PROPERTY)
        if name:
            action.setIcon(icon(name))


def key_sequences(
    shortcuts: Iterable[Shortcut], *, platform_keys: bool = False
) -> list[QKeySequence]:
    """The key sequences of ``shortcuts``, each key once (the platform's list may repeat a
    key, and a key bound twice is "ambiguous": it does nothing). A standard key is its primary
    sequence, or every sequence the platform binds to it with ``platform_keys``."""
    unique: list[QKeySequence] = []
    for shortcut in shortcuts:
        if isinstance(shortcut, QKeySequence.StandardKey) and platform_keys:
            sequences = QKeySequence.keyBindings(shortcut)
        else:
            sequences = [QKeySequence(shortcut)]
        for sequence in sequences:
            if not sequence.isEmpty() and sequence not in unique:
                unique.append(sequence)
    return unique


def enable_with_reason(action: QAction, enabled: bool, tip: str, reason: str) -> None:
    """Enable ``action``, or disable it with ``reason`` appended to ``tip`` as its tooltip."""
    action.setEnabled(enabled)
    shown = tip if enabled else (f"{tip} — {reason}" if tip else reason)
    action.setToolTip(shown or action.text().replace("&", ""))
    action.setStatusTip(shown)


class ActionSet:
    """The window's ``QAction`` objects built from ``ACTIONS``, its menus and its toolbar.

    Args:
        window: the parent of every action, menu and the toolbar.
        handlers: what each action does, by id (ids without a handler and not ``provided``
            are an error).
        provided: ready-made actions by id (undo and redo from the undo stack, the runtime
            panels' actions); the spec's shortcut and icon are applied to them.
        specs: the actions (default ``ACTIONS``).
    """

    def __init__(
        self,
        window: QMainWindow,
        handlers: Mapping[str, Callable[[], object]],
        *,
        provided: Mapping[str, QAction] | None = None,
        specs: Iterable[ActionSpec] = ACTIONS,
    ) -> None:
        self._window = window
        self.specs: dict[str, ActionSpec] = {spec.id: spec for spec in specs}
        self.actions: dict[str, QAction] = {}
        self.submenus: dict[str, QMenu] = {}
        self._submenu_specs: dict[str, SubmenuSpec] = {}
        provided = provided or {}
        for spec in self.specs.values():
            if spec.id in provided:
                action = provided[spec.id]
                self._apply(spec, action, set_tip=False)
            else:
                action = QAction(spec.text, window)
                self._apply(spec, action, set_tip=True)
                handler = handlers[spec.id]
                action.triggered.connect(lambda _checked=False, run=handler: run())
            if spec.window_wide:
                window.addAction(action)
            self.actions[spec.id] = action

    @staticmethod
    def _apply(spec: ActionSpec, action: QAction, *, set_tip: bool) -> None:
        keys = key_sequences(spec.shortcuts, platform_keys=spec.platform_keys)
        if keys:
            action.setShortcuts(keys)
        if spec.icon:
            set_action_icon(action, spec.icon)
        if spec.object_name:
            action.setObjectName(spec.object_name)
        if set_tip and spec.tip:
            action.setStatusTip(spec.tip)
            action.setToolTip(spec.tip)

    def __getitem__(self, action_id: str) -> QAction:
        return self.actions[action_id]

    def build_menus(self, menus: Iterable[MenuSpec], docks: Iterable[QAction] = ()) -> None:
        """Fill the window's menu bar from ``menus``; ``docks`` go where ``DOCKS`` is."""
        bar = self._window.menuBar()
        for menu_spec in menus:
            menu = bar.addMenu(menu_spec.title)
            menu.setToolTipsVisible(True)
            self._fill(menu, menu_spec.items, docks)

    def _fill(
        self, menu: QMenu, items: Iterable[str | SubmenuSpec], docks: Iterable[QAction]
    ) -> None:
        for item in items:
            if isinstance(item, SubmenuSpec):
                submenu = menu.addMenu(item.title)
                submenu.setToolTipsVisible(True)
                self.submenus[item.id] = submenu
                self._submenu_specs[item.id] = item
            elif item == SEPARATOR:
                menu.addSeparator()
            elif item == DOCKS:
                for toggle in docks:
                    menu.addAction(toggle)
            else:
                menu.addAction(self.actions[item])

    def build_toolbar(self, items: Iterable[str], widgets: Mapping[str, QWidget]) -> QToolBar:
        """Make the main toolbar (``mainToolbar``) from ``items``; ``widgets`` by id go
        between the actions (the hardware selector)."""
        window = self._window
        toolbar = QToolBar("Main", window)
        toolbar.setObjectName("mainToolbar")
        toolbar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        for item in items:
            if item == SEPARATOR:
                toolbar.addSeparator()
            elif item in widgets:
                toolbar.addWidget(widgets[item])
            else:
                action = self.actions[item]
                toolbar.addAction(action)
                button = toolbar.widgetForAction(action)
                if self.specs[item].icon_only and isinstance(button, QToolButton):
                    button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)
        window.addToolBar(Qt.ToolBarArea.TopToolBarArea, toolbar)
        return toolbar

    def refresh(self, state: WindowState) -> None:
        """Recompute every enabled state (and the tooltip saying why one is disabled)."""
        for spec in self.specs.values():
            if spec.enabled_when is None:
                continue
            action, enabled = self.actions[spec.id], spec.enabled_when(state)
            if spec.explain_disabled:
                enable_with_reason(action, enabled, spec.tip, NEEDS_MODEL)
            else:
                action.setEnabled(enabled)
        for menu_id, submenu_spec in self._submenu_specs.items():
            if submenu_spec.enabled_when is not None:
                enable_with_reason(
                    self.submenus[menu_id].menuAction(),
                    submenu_spec.enabled_when(state),
                    "",
                    disabled_reason(state),
                )


def follow_command_text(action: QAction, verb: str, text_changed: object) -> None:
    """Keep a toolbar button at ``verb`` while the menu entry names the command ("Undo Move
    'norm' to disk"); the tooltip names it too, so the toolbar does not grow with the name.

    Args:
        action: the undo or redo action.
        verb: "Undo" or "Redo".
        text_changed: the undo stack's ``undoTextChanged`` / ``redoTextChanged`` signal.
    """
    action.setIconText(verb)
    tip = _CommandTip(action, verb)
    text_changed.connect(tip.follow)  # type: ignore[attr-defined]  # a QObject slot
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


__all__ = [
    "ACTIONS",
    "MAX_LANE_SHORTCUTS",
    "MENUS",
    "NEEDS_MODEL",
    "NEEDS_SELECTION",
    "SEPARATOR",
    "TOOLBAR",
    "ActionSet",
    "ActionSpec",
    "MenuSpec",
    "SubmenuSpec",
    "WindowState",
    "enable_with_reason",
    "follow_command_text",
    "key_sequences",
    "needs_model",
    "needs_selection",
    "retint_action_icons",
    "set_action_icon",
]
