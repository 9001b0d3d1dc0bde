"""What the app remembers between runs (``QSettings``) and where the session autosaves.

Window geometry and dock/splitter state, recent models, the planner's memory-model controls
and the last hardware profile (not its budgets: they belong to the model and its session)
live in ``QSettings`` (organisation and application names set in ``app.py``). The session
autosaves to ``<AppDataLocation>/autosave-session.json``; a run that did not exit cleanly
leaves ``session/clean_exit`` false, so the next start offers to restore it.

Tests point both at a temporary folder (``QSettings.setPath`` with ``IniFormat`` and
``XDG_DATA_HOME``), so they never touch the user's real settings.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QSettings, QStandardPaths

from workbench.runtime import atomic_write_text

logger = logging.getLogger(__name__)

ORGANIZATION = "model-memory-workbench"
MAX_RECENT = 10
AUTOSAVE_NAME = "autosave-session.json"


def app_settings() -> QSettings:
    """Return the app's ``QSettings`` (the format and folder the application configured)."""
    return QSettings(
        QSettings.defaultFormat(), QSettings.Scope.UserScope, ORGANIZATION, "workbench"
    )


RECENT_SESSIONS_KEY = "recent/sessions"  # saved sessions, listed apart from the models


def recent_models(key: str = "recent/models") -> list[str]:
    """Return recently opened sources (``key="recent/sessions"``: session files), newest first."""
    value = app_settings().value(key, [])
    if isinstance(value, str):  # QSettings returns a single-item list as a plain string
        value = [value]
    return [str(v) for v in value or []][:MAX_RECENT]


def add_recent_model(source: str, key: str = "recent/models") -> list[str]:
    """Put ``source`` first in the recent list of ``key`` (deduplicated, at most
    ``MAX_RECENT``); sessions go to ``"recent/sessions"``, apart from the models."""
    models = [source, *(m for m in recent_models(key) if m != source)][:MAX_RECENT]
    settings = app_settings()
    settings.setValue(key, models)
    settings.sync()
    return models


def dialog_folder(kind: str) -> Path:
    """The folder a file dialog of ``kind`` (``"open"``, ``"session"``, ``"map"``, ``"runs"``)
    starts in: where that kind of file was last chosen, else the home folder (never the folder
    the app was launched from, where a session file once landed by default)."""
    saved = app_settings().value(f"dialogs/{kind}", "")
    folder = Path(str(saved)) if saved else None
    return folder if folder is not None and folder.is_dir() else Path.home()


def remember_dialog_folder(kind: str, chosen: str | Path) -> None:
    """Remember the folder of ``chosen`` (a file: its folder; a folder: itself) for the next
    dialog of ``kind``."""
    path = Path(chosen)
    folder = path if path.is_dir() else path.parent
    settings = app_settings()
    settings.setValue(f"dialogs/{kind}", str(folder))
    settings.sync()


def save_last_hardware(profile_name: str) -> None:
    """Remember the chosen hardware profile: the one thing that carries over to the next
    launch and the next model. Budgets do not: each model starts from the profile's (a
    session file keeps the budgets edited for its model)."""
    settings = app_settings()
    settings.setValue("hardware/profile", profile_name)
    settings.remove("hardware/budgets")  # written by earlier versions; never read again
    settings.sync()


def last_hardware() -> str | None:
    """Return the last hardware profile's name (``None`` the first time)."""
    name = app_settings().value("hardware/profile", None)
    return str(name) if name else None


def save_planner_memory(options: Mapping[str, Any]) -> None:
    """Remember the planner panel's memory-model controls (``reserve_mode``, ``batch``,
    ``context`` (0: the model's), ``context_cap``, ``kv_dtype``, ``kv_engine``)."""
    settings = app_settings()
    for key, value in options.items():
        settings.setValue(f"planner/{key}", value)
    settings.sync()


def planner_memory(defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The saved planner memory-model controls; ``defaults`` for missing or unreadable ones
    (QSettings' INI format gives ints back as strings)."""
    settings = app_settings()
    values: dict[str, Any] = {}
    for key, default in defaults.items():
        value = settings.value(f"planner/{key}", default)
        try:
            values[key] = type(default)(value)
        except (TypeError, ValueError):
            logger.warning("ignoring the saved planner/%s %r", key, value)
            values[key] = default
    return values


def save_window_state(
    geometry: QByteArray, state: QByteArray, splitters: Mapping[str, QByteArray]
) -> None:
    """Remember the main window's geometry, dock layout and splitter positions."""
    settings = app_settings()
    settings.setValue("window/geometry", geometry)
    settings.setValue("window/state", state)
    for name, value in splitters.items():
        settings.setValue(f"window/splitter/{name}", value)
    settings.sync()


def window_state(splitter_names: list[str]) -> dict[str, Any]:
    """Return saved ``geometry``, ``state`` and ``splitters`` (values may be ``None``)."""
    settings = app_settings()
    return {
        "geometry": settings.value("window/geometry", None),
        "state": settings.value("window/state", None),
        "splitters": {n: settings.value(f"window/splitter/{n}", None) for n in splitter_names},
    }


def autosave_path() -> Path:
    """Return the autosave file in the platform's app-data folder (created on demand)."""
    folder = Path(QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation))
    return folder / AUTOSAVE_NAME


def write_autosave(session_data: Mapping[str, Any]) -> Path:
    """Write the session's JSON data to the autosave file atomically and mark the run dirty
    (no ``autosave_closed_by`` yet: until the run says otherwise, it is one that crashes)."""
    path = autosave_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(session_data, indent=1, sort_keys=True) + "\n")
    set_clean_exit(False)
    app_settings().remove("session/closed_by")
    return path


def set_autosave_closed_by(signal_name: str) -> None:
    """Record that the run whose work the autosave holds was closed by ``signal_name``
    (``"SIGTERM"``: a logout, a shutdown, ``kill``), not a crash (read at the next start)."""
    settings = app_settings()
    settings.setValue("session/closed_by", signal_name)
    settings.sync()


def autosave_closed_by() -> str | None:
    """The signal that closed the run whose work the autosave holds (``None``: that run
    crashed or was killed without a chance to say)."""
    value = app_settings().value("session/closed_by", None)
    return str(value) if value else None


def set_clean_exit(clean: bool) -> None:
    """Record whether the app exited cleanly (read at the next start)."""
    settings = app_settings()
    settings.setValue("session/clean_exit", bool(clean))
    settings.sync()


def pending_autosave() -> Path | None:
    """Return the autosave file when the last run ended without a clean exit, else ``None``."""
    path = autosave_path()
    clean = app_settings().value("session/clean_exit", True)
    clean = clean not in (False, "false", 0, "0")
    if path.is_file() and not clean:
        return path
    return None


def discard_autosave() -> None:
    """Remove the autosave file and mark the run clean (after a clean exit or a discard)."""
    autosave_path().unlink(missing_ok=True)
    app_settings().remove("session/closed_by")
    set_clean_exit(True)
