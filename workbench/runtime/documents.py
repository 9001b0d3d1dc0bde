"""What a path handed to the app is: a workbench session, a device map, or a model.

``workbench PATH``, ``workbench --open PATH``, File > Open, a drop on the window and the recent
list all pass paths; :func:`classify_document` decides which reader gets each, so a session
file is restored (not opened as a model config, which failed with "has no 'model_type'") and a
map file is imported. No Qt: the CLI and the window share it.

Rules, in order:

1. a folder, or a file named ``config.json``: a model;
2. a ``.json`` file whose top-level ``"format"`` is ``"workbench-session"``: a session;
3. ``"format": "workbench-device-map"`` (the wrapped map): a map, with the model source it
   was made for in ``model_source``;
4. a JSON object naming a ``model_type`` or ``architectures``: a model config;
5. any other JSON object whose values are all devices (``0``, ``"cpu"``, ``"disk"``…): a
   plain map;
6. anything else (bundled config names, ``hf-cache:REPO``, files that do not parse): a model,
   so the model opener reports the problem in its own words.

Example:
    >>> classify_document("s.wbsession.json").kind  # doctest: +SKIP
    'session'
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from workbench.big_modeling.device_map.files import FORMAT_NAME as MAP_FORMAT
from workbench.big_modeling.devices import normalize_device
from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.json_files import JsonFileError, read_json
from workbench.runtime.session import SESSION_FORMAT

__all__ = [
    "MAP_SUFFIX",
    "SESSION_SUFFIX",
    "Document",
    "DocumentKind",
    "classify_document",
]

DocumentKind = Literal["session", "map", "model"]

SESSION_SUFFIX = ".wbsession.json"  # the shared-mime-info glob of application/x-workbench-session
MAP_SUFFIX = ".wbmap.json"  # application/x-workbench-device-map
_MAX_SNIFF_NBYTES = 64 * 2**20  # sessions and maps are small; a bigger .json is not ours


@dataclass(frozen=True)
class Document:
    """A classified path: ``kind``, the path as given, and for a wrapped map the model source
    recorded in it (``None`` for a plain map or when it names none)."""

    kind: DocumentKind
    path: str
    model_source: str | None = None


def classify_document(path: str | os.PathLike[str]) -> Document:
    """Say whether ``path`` is a session, a device map or a model (see the module rules).

    Never raises for a file it cannot read: such a path is classed ``model`` and the model
    opener reports the problem.
    """
    text = str(path)
    target = Path(text)
    if target.is_dir() or target.name == "config.json" or target.suffix != ".json":
        return Document("model", text)
    data = _sniff_json(target)
    if not isinstance(data, dict):
        return Document("model", text)
    form = data.get("format")
    if form == SESSION_FORMAT:
        return Document("session", text)
    if form == MAP_FORMAT:
        model = data.get("model")
        source = model.get("source") if isinstance(model, dict) else None
        return Document("map", text, source if isinstance(source, str) and source else None)
    if "model_type" in data or "architectures" in data:
        return Document("model", text)
    if data and all(_is_device(value) for value in data.values()):
        return Document("map", text)
    return Document("model", text)


def _sniff_json(path: Path) -> Any:
    try:
        if not path.is_file() or path.stat().st_size > _MAX_SNIFF_NBYTES:
            return None
        return read_json(path, what="a workbench file", fix="", max_nbytes=_MAX_SNIFF_NBYTES)
    except (OSError, JsonFileError):
        return None


def _is_device(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return False
    try:
        normalize_device(value)
    except (BadInputError, ValueError, TypeError):
        return False
    return True
