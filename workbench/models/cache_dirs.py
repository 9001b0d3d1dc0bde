"""Where the workbench caches what it makes (demo checkpoints, converted GGUF files), the
modes a finished cache folder gets, and how a measurement cache file is read and written."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from dataclasses import replace as dataclass_replace
from pathlib import Path
from typing import Any, TypeVar

from workbench.big_modeling.atomic import atomic_write_text
from workbench.big_modeling.json_files import JsonFileError, read_json
from workbench.models.machine_load import contended

logger = logging.getLogger(__name__)

Probe = TypeVar("Probe")


def workbench_cache_dir() -> Path:
    """The workbench's cache folder: ``$WORKBENCH_CACHE_DIR`` or the user cache folder."""
    explicit = os.environ.get("WORKBENCH_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "model-memory-workbench"


def make_readable(folder: Path) -> None:
    """Give the staged folder the modes a plain ``mkdir``/``open`` would (temp files are 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~umask)


def read_measurement_cache(path: Path, field: str) -> dict[str, Any]:
    """The ``field`` table of the measurement cache ``path`` (a JSON object); ``{}`` when the
    file is missing, malformed (logged: it is measured again and rewritten) or has no table."""
    try:
        data = read_json(
            path,
            what=f"the measurement cache {path.name}",
            fix="It is measured again and rewritten.",
            max_nbytes=2**20,
        )
    except FileNotFoundError:
        return {}
    except JsonFileError as exc:
        logger.warning("%s", exc)
        return {}
    table = data.get(field) if isinstance(data, dict) else None
    return dict(table) if isinstance(table, dict) else {}


def write_measurement_cache(path: Path, field: str, table: dict[str, Any]) -> None:
    """Write ``table`` as the ``field`` table of the measurement cache ``path``, atomically
    (``{"version": 1, field: table}``), making its folder.

    Raises:
        OSError: the folder or the file could not be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"version": 1, field: table}, indent=2) + "\n")


def cached_probe(
    path: Path,
    field: str,
    key: str,
    probe_type: Callable[..., Probe],
    measure: Callable[[], Probe],
    *,
    measure_if_missing: bool,
    what: str,
    again: bool = False,
) -> Probe | None:
    """A machine's probe (a dataclass) from the ``field`` table of the cache ``path`` under
    ``key``, else ``measure()``'s, written there; ``None`` when nothing is cached and
    ``measure_if_missing`` is false, or the measurement fails (``RuntimeError``,
    ``ImportError``: logged, the caller's typical values stand). ``again``: measure now
    whatever is cached (``measure_probe``). A malformed cache file or entry is measured again,
    never fatal; a cache that cannot be written is logged."""
    if again:
        return measure_probe(path, field, key, measure, what=what)
    entries = read_measurement_cache(path, field)
    cached = entries.get(key)
    if isinstance(cached, dict):
        try:
            probe = probe_type(**cached)
        except TypeError:
            logger.warning("%s cache %s: bad entry for %s; measuring again", what, path, key)
        else:
            if measure_if_missing and _retry_due(probe):
                return _measure_again_if_quieter(path, field, key, probe, measure, what=what)
            return probe
    if not measure_if_missing:
        return None
    return measure_probe(path, field, key, measure, what=what)


CONTENDED_RETRY_S = 600.0
"""How long a contended probe (``machine_load.contended``) stands before it is measured again."""


def _retry_due(probe: object) -> bool:
    measured_at = getattr(probe, "measured_at", None)
    return (
        contended(probe)
        and isinstance(measured_at, int | float)
        and time.time() - measured_at >= CONTENDED_RETRY_S
    )


def _measure_again_if_quieter(
    path: Path, field: str, key: str, cached: Probe, measure: Callable[[], Probe], *, what: str
) -> Probe:
    """A contended ``cached`` probe measured again: the new one replaces it when other
    processes took less of the machine during it; else ``cached`` stays, its ``measured_at``
    moved to now (the next try is ``CONTENDED_RETRY_S`` later)."""
    try:
        fresh: Probe | None = measure()
    except (RuntimeError, ImportError) as exc:
        logger.warning("%s not measured again: %s", what, exc)
        fresh = None
    busy = getattr(cached, "others_busy", None) or 0.0
    fresh_busy = getattr(fresh, "others_busy", None)
    if fresh is not None and (fresh_busy is None or fresh_busy < busy):
        kept = fresh
    else:
        kept = dataclass_replace(cached, measured_at=time.time())  # type: ignore[type-var]
        logger.info("%s: measured again under as much load; the earlier figures stay", what)
    _store(path, field, key, kept, what=what)
    return kept


def measure_probe(
    path: Path, field: str, key: str, measure: Callable[[], Probe], *, what: str
) -> Probe | None:
    """``measure()``'s probe, written under ``key`` in the ``field`` table of the cache
    ``path`` in place of what was there; ``None`` when the measurement fails (``RuntimeError``,
    ``ImportError``: logged, the cache keeps its entry). A cache that cannot be written is
    logged."""
    try:
        probe = measure()
    except (RuntimeError, ImportError) as exc:
        logger.warning("%s not measured, typical values used: %s", what, exc)
        return None
    _store(path, field, key, probe, what=what)
    return probe


def _store(path: Path, field: str, key: str, probe: Any, *, what: str) -> None:
    """Write ``probe`` under ``key`` in the ``field`` table of the cache ``path`` (a failed
    write is logged: the probe is used all the same)."""
    entries = read_measurement_cache(path, field)
    entries[key] = asdict(probe)
    try:
        write_measurement_cache(path, field, entries)
    except OSError as exc:
        logger.warning("%s cache %s not written: %s", what, path, exc)
