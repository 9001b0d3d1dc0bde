"""What the window's dynamic menus, drops and open dialogs do (``workbench.gui.actions``
declares the actions themselves).

Each function receives what it needs (a menu, the lanes, a ``WindowContext``), never the
window class: File > What-if and File > Recent open through ``open_replacing``, Edit > Move
selection to and the tree's context menu reuse the window's lane actions (Ctrl+1..9), a drop
opens, restores or imports what was dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QMimeData, QPoint, Qt
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import QFileDialog, QMenu, QWidget

from workbench.gui import map_io
from workbench.gui import settings as app_settings
from workbench.gui.actions import MAX_LANE_SHORTCUTS, WindowState, disabled_reason, needs_selection
from workbench.gui.actions import enable_with_reason as _enable
from workbench.gui.cache_browser import CacheBrowser
from workbench.gui.open_dialog import open_model_dialog
from workbench.gui.precision_column import add_precision_menu
from workbench.gui.tree_view import ModuleTreeView
from workbench.gui.window_context import WindowContext
from workbench.models.catalog import list_bundled_configs
from workbench.runtime import BadInputError, device_label, read_json
from workbench.runtime.documents import SESSION_SUFFIX, classify_document

logger = logging.getLogger(__name__)

Opener = Callable[[str], object]


def fill_whatif_menu(menu: QMenu, open_replacing: Opener) -> None:
    """File > What-if model: the bundled configs (shapes only), each opening in place."""
    try:
        entries = list_bundled_configs()
    except (OSError, BadInputError) as exc:  # a broken install: the window works without them
        logger.warning("no what-if models: %s", exc)
        entries = []
    for entry in entries:
        action = menu.addAction(entry.name)
        action.setToolTip(f"{entry.architecture} ({entry.model_type}), shapes only, no weights")
        action.triggered.connect(lambda _c=False, p=str(entry.path): open_replacing(p))


def refresh_recent_menu(menu: QMenu, open_replacing: Opener) -> None:
    """Rebuild File > Recent models from the settings: the models, then a "Sessions" section
    with the saved sessions (a session file listed among the models by an older version
    moves there)."""
    menu.clear()
    listed = app_settings.recent_models()
    models = [s for s in listed if not s.endswith(SESSION_SUFFIX)]
    sessions = app_settings.recent_models(app_settings.RECENT_SESSIONS_KEY)
    sessions += [s for s in listed if s.endswith(SESSION_SUFFIX) and s not in sessions]
    for source in models:
        action = menu.addAction(source)
        action.triggered.connect(lambda _c=False, s=source: open_replacing(s))
    if sessions:
        menu.addSection("Sessions")
    for path in sessions:
        action = menu.addAction(path)
        action.setToolTip("A saved session: the model with its map, budgets and profile")
        action.triggered.connect(lambda _c=False, s=path: open_replacing(s))
    menu.setEnabled(bool(models or sessions))


def fill_move_menu(
    menu: QMenu,
    devices: Sequence[int | str],
    lane_actions: Mapping[str, QAction],
    move_to: Callable[[int | str], object],
) -> None:
    """One entry per lane: the first nine are the window's Ctrl+N lane actions (their text
    becomes the device's name), the others move the selection there directly."""
    menu.clear()  # keeps the window's lane actions (the menu does not own them)
    for number, device in enumerate(devices, start=1):
        if number <= MAX_LANE_SHORTCUTS:
            action = lane_actions[f"lane_{number}"]
            action.setText(device_label(device))
            menu.addAction(action)
            continue
        action = menu.addAction(device_label(device))
        action.triggered.connect(lambda _c=False, d=device: move_to(d))


def tree_context_menu(
    parent: QWidget,
    view: ModuleTreeView,
    pos: QPoint,
    state: WindowState,
    fill_move: Callable[[QMenu], None],
) -> QMenu:
    """The tree's context menu at ``pos``: Move to (the lanes), Set precision, Copy name,
    Expand all below."""
    menu = QMenu(parent)
    menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    menu.setToolTipsVisible(True)
    move_menu = menu.addMenu("Move to")
    fill_move(move_menu)
    names = view.selected_names()
    _enable(move_menu.menuAction(), needs_selection(state), "", disabled_reason(state))
    add_precision_menu(menu, parent, names)
    copy = menu.addAction("Copy name")
    copy.setEnabled(bool(names))
    copy.triggered.connect(lambda: QGuiApplication.clipboard().setText("\n".join(names)))
    expand = menu.addAction("Expand all below")
    index = view.indexAt(pos)
    expand.setEnabled(index.isValid())
    expand.triggered.connect(lambda: view.expandRecursively(index))
    menu.popup(view.viewport().mapToGlobal(pos))
    return menu


def open_dialog(parent: QWidget, open_replacing: Opener) -> None:
    """One dialog for a config file or a model folder (see ``gui.open_dialog``), started where
    the last model was chosen."""

    def chosen(path: str) -> None:
        app_settings.remember_dialog_folder("open", Path(path).parent)
        open_replacing(path)

    open_model_dialog(parent, str(app_settings.dialog_folder("open"))).chosen.connect(chosen)


def open_folder_dialog(parent: QWidget, open_replacing: Opener) -> None:
    """Ask for a model folder and open it."""
    path = QFileDialog.getExistingDirectory(parent, "Open model folder")
    if path:
        open_replacing(path)


def show_cache_browser(parent: QWidget, open_replacing: Opener) -> None:
    """List models in the local Hugging Face cache (offline); double-click opens one."""
    browser = CacheBrowser(parent)
    browser.chosen.connect(open_replacing)
    browser.show()


def dropped_paths(mime: QMimeData) -> list[Path]:
    """Local files or folders in a drop (config.json, model folders, device-map JSON)."""
    if not mime.hasUrls():
        return []
    return [Path(url.toLocalFile()) for url in mime.urls() if url.isLocalFile()]


def handle_dropped_path(window: WindowContext, path: Path) -> None:
    """A folder or ``config.json`` opens a model, a session file is restored; any other
    ``.json`` is imported as a map."""
    if path.is_dir() or path.name == "config.json" or _looks_like_config(path):
        window.open_replacing(str(path))
    elif classify_document(path).kind in ("session", "map"):
        window.open_replacing(str(path))  # a session is restored, a map imported
    elif path.suffix == ".json":
        map_io.import_device_map(window, path)  # type: ignore[arg-type]
    else:
        window.show_error(
            "Cannot use this file",
            f"{path}: drop a model folder, a config.json or a device-map .json",
        )


def _looks_like_config(path: Path) -> bool:
    """True for a transformers config saved under another name (it names a ``model_type``)."""
    if path.suffix != ".json" or not path.is_file() or path.stat().st_size > 1_000_000:
        return False
    try:
        data: Any = read_json(path, what="a model config", fix="", max_nbytes=1_000_000)
    except (OSError, BadInputError):  # deep, huge-integer or broken JSON: not a config
        return False
    return isinstance(data, dict) and ("model_type" in data or "architectures" in data)
