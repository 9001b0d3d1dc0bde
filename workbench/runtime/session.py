"""The session: the user's document (model source, device map, budgets, profile, options).

The reserve is stored as the memory model's options (``memory``: batch, context, KV dtype,
engine, cap, prefill), so a reopened session gives each device the reserve it had
(``device_reserves``); ``reserve`` keeps the one figure of a fixed reserve (and of files from
before the options were stored, which still open, with ``memory`` ``None``).

Plain Python, no Qt: views subscribe with plain callbacks and get a ``SessionChange`` naming
what changed. Every edit goes through a ``set_*``/``assign`` method, which marks the session
dirty and notifies. ``save`` writes JSON atomically; ``Session.restore`` reads it back (the
opened model itself is not stored: call ``reopen()`` to rebuild it from ``source``).

Example:
    >>> session = Session(source="/models/demo")
    >>> changes = []
    >>> unsubscribe = session.subscribe(changes.append)
    >>> session.set_device_map({"": "cpu"}, reason="start")
    >>> changes[0].what, session.dirty
    ('device_map', True)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.big_modeling.atomic import atomic_write_text
from workbench.big_modeling.device_map.value import normalize_device_map
from workbench.big_modeling.devices import DeviceDict, normalize_device
from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.json_files import read_json
from workbench.big_modeling.planning.sizes import convert_file_size_to_int
from workbench.models import hardware
from workbench.models.intake import open_model
from workbench.runtime.model_context import ModelContext
from workbench.runtime.planning import MemoryOptions
from workbench.runtime.planning import device_reserves as planned_reserves

logger = logging.getLogger(__name__)

SESSION_FORMAT = "workbench-session"
SESSION_VERSION = 1


class SessionFileError(BadInputError):
    """A session file that cannot be read: not JSON, wrong format or version, bad fields."""


@dataclass(frozen=True)
class SessionChange:
    """What changed: ``what`` is one of ``source``, ``opened``, ``device_map``, ``budgets``,
    ``reserve``, ``memory``, ``profile``, ``planner_options``, ``dtype``, ``precision_map``,
    ``dirty``, ``restored``.
    ``names`` lists the modules an ``assign`` touched; ``reason`` is the caller's text.
    """

    what: str
    reason: str = ""
    names: tuple[str, ...] = ()


SessionCallback = Callable[[SessionChange], None]


class Session:
    """The document. Attributes are read freely; change them only through the methods.

    Args:
        source: a config.json, a model folder or ``hf-cache:REPO_ID``.
        device_map: ``{module prefix: device}``; values are normalised (``"cuda:0"`` -> ``0``).
        budgets: ``{device: bytes}`` for the planner.
        reserve: bytes kept free on the execution device for activations (the fixed
            reserve, or the execution device's share of the memory model's).
        memory: the memory model's options the reserve is planned with
            (``runtime.planning.MemoryOptions``); ``None``: a fixed reserve.
        planner_options: free-form planner settings (e.g. ``{"strategy": "auto"}``).
        dtype: the dtype to load in (``"float16"``) or ``None`` for the checkpoint's.
        precision_map: ``{module prefix: precision}`` (``"int4-g128"``, ``"int8"``...): the
            precisions to load in (``runtime.precision_session``); ``{}``: the model's dtype.
    """

    def __init__(
        self,
        source: str | None = None,
        *,
        device_map: Mapping[str, object] | None = None,
        budgets: Mapping[object, int] | None = None,
        reserve: int = 0,
        planner_options: Mapping[str, Any] | None = None,
        dtype: str | None = None,
        profile: Any = None,
        precision_map: Mapping[str, str] | None = None,
        memory: MemoryOptions | None = None,
    ) -> None:
        self.source: str | None = source
        self.context: ModelContext | None = None  # everything derived from the opened model
        self._generation = 0
        self.device_map: DeviceDict = _normalize_map(device_map or {})
        self.budgets: dict[int | str, int] = _normalize_budgets(budgets or {})
        self.reserve: int = int(reserve)
        self.memory: MemoryOptions | None = _check_memory(memory)
        self.planner_options: dict[str, Any] = dict(planner_options or {})
        self.dtype: str | None = dtype
        self.precision_map: dict[str, str] = _check_precision_map(precision_map or {})
        self.profile: Any = profile  # workbench.models.HardwareProfile or None
        self.dirty: bool = False
        self.path: Path | None = None
        self._subscribers: list[SessionCallback] = []
        self._lock = threading.RLock()

    # -- notifications -------------------------------------------------------------------

    def subscribe(self, callback: SessionCallback) -> Callable[[], None]:
        """Call ``callback(SessionChange)`` after every change; return the unsubscribe function."""
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def _changed(self, what: str, reason: str = "", names: Iterable[str] = ()) -> None:
        was_dirty = self.dirty
        if what not in ("opened", "restored"):
            self.dirty = True
        change = SessionChange(what=what, reason=reason, names=tuple(names))
        self._notify(change)
        if self.dirty != was_dirty:
            self._notify(SessionChange(what="dirty"))

    def _notify(self, change: SessionChange) -> None:
        with self._lock:
            callbacks = list(self._subscribers)
        for callback in callbacks:
            try:
                callback(change)
            except Exception:  # one broken view must not stop the others
                logger.exception("session subscriber %r failed on %s", callback, change.what)

    # -- the model -----------------------------------------------------------------------

    @property
    def opened(self) -> Any:
        """The opened model (``workbench.models.OpenedModel``), or ``None`` before ``open``."""
        return None if self.context is None else self.context.opened

    @property
    def tree(self) -> Any:
        """The opened model's ``ModuleTree``, or ``None`` before ``open``."""
        return None if self.context is None else self.context.tree

    def set_source(self, source: str | None, *, reason: str = "") -> None:
        """Point the session at another model; drops the opened model (call ``reopen``)."""
        self.source = None if source is None else str(source)
        self.context = None
        self._changed("source", reason)

    def set_opened(self, opened: Any) -> None:
        """Attach an ``OpenedModel`` (built elsewhere, e.g. on a thread) to the session.

        The same model re-sized (a planning-dtype switch) keeps the current ``context``; the
        first model for ``source`` gets a new one (``replace_model``).
        """
        if self.context is None or self.context.source != str(self.source):
            self.replace_model(self.source or "", opened)
            return
        self.context.opened = opened
        self._changed("opened")

    def replace_model(self, source: str, opened: Any, *, reason: str = "open") -> ModelContext:
        """Show another model: a new ``ModelContext`` replaces the old one whole (its planner
        results, reserve and loaded-model record go with it); return the new context."""
        self.source = str(source)
        self._generation += 1
        self.context = ModelContext(self.source, opened, generation=self._generation)
        self._changed("opened", reason)
        return self.context

    def reopen(self) -> Any:
        """Open ``source`` with ``workbench.models.open_model`` and attach it; return it.

        Raises:
            BadInputError: when ``source`` is unset or cannot be opened.
        """
        if not self.source:
            raise BadInputError("the session has no model source; open a config.json or folder")
        self.set_opened(open_model(self.source, dtype=self.dtype))
        return self.opened

    # -- edits (each one an undo step in the GUI) ------------------------------------------

    def set_device_map(self, device_map: Mapping[str, object], *, reason: str = "") -> DeviceDict:
        """Replace the device map; return the previous one (for undo)."""
        new_map = _normalize_map(device_map)
        with self._lock:
            previous, self.device_map = self.device_map, new_map
        self._changed("device_map", reason, names=sorted(set(previous) ^ set(new_map)))
        return dict(previous)

    def assign(self, names: list[str], device: object) -> DeviceDict:
        """Put modules ``names`` (and their subtrees) on ``device``; return the previous map.

        An entry of an ancestor that covered a name is split into that ancestor's other
        children (using the opened tree), so entries never overlap; entries below a name are
        dropped. ``set_device_map(previous)`` undoes the edit exactly.

        Raises:
            DeviceMapError: for an unknown device value.
        """
        target = normalize_device(device)  # type: ignore[arg-type]
        with self._lock:
            previous = dict(self.device_map)
            new_map = dict(previous)
            for name in names:
                self._split_covering_entry(new_map, name)
                for key in [k for k in new_map if _is_under(k, name) and k != name]:
                    del new_map[key]
                new_map[name] = target
            self.device_map = new_map
        self._changed("device_map", f"assign to {target}", names=names)
        return previous

    def _split_covering_entry(self, device_map: DeviceDict, name: str) -> None:
        tree = self.tree
        covering = next(
            (k for k in sorted(device_map, key=len, reverse=True) if _is_under(name, k)), None
        )
        if covering is None or covering == name or tree is None or name not in tree:
            return
        device = device_map.pop(covering)
        node = tree.node(name)
        while node.parent is not None and node.name != covering:
            for sibling in node.parent.children:
                if sibling.name != node.name:
                    device_map.setdefault(sibling.name, device)
            for tensor in getattr(node.parent, "tensor_names", []) or []:
                if tensor.rpartition(".")[0] == node.parent.name:
                    device_map.setdefault(tensor, device)
            node = node.parent

    def set_budgets(self, budgets: Mapping[object, int], *, reason: str = "") -> dict:
        """Replace the per-device budgets (bytes); return the previous ones."""
        previous, self.budgets = self.budgets, _normalize_budgets(budgets)
        self._changed("budgets", reason)
        return dict(previous)

    def set_profile(self, profile: Any, *, reason: str = "") -> Any:
        """Set the ``HardwareProfile``; return the previous one."""
        previous, self.profile = self.profile, profile
        self._changed("profile", reason)
        return previous

    def set_reserve(self, nbytes: int, *, reason: str = "") -> int:
        """Set the activation reserve in bytes; return the previous value."""
        previous, self.reserve = self.reserve, int(nbytes)
        self._changed("reserve", reason)
        return previous

    def set_memory(self, memory: MemoryOptions | None, *, reason: str = "") -> MemoryOptions | None:
        """Set the memory model's options (``None``: a fixed reserve); return the previous ones.
        Setting the options the session has is no change (no notification, not dirty).

        Raises:
            BadInputError: ``memory`` is neither ``MemoryOptions`` nor ``None``.
        """
        previous, memory = self.memory, _check_memory(memory)
        if memory != previous:
            self.memory = memory
            self._changed("memory", reason)
        return previous

    def device_reserves(self) -> dict[Any, Any] | None:
        """Each device's ``DeviceReserve`` for the session's map and memory options (what the
        lanes and the planner show), or ``None`` without options, a model or a map.

        Raises:
            BadInputError: a config the memory model cannot read, or a map that leaves a
                decoder layer on no device.
        """
        if self.memory is None or self.opened is None or not self.device_map:
            return None
        return planned_reserves(self.opened, self.device_map, self.memory, self.precision_map)

    def set_planner_options(self, options: Mapping[str, Any], *, reason: str = "") -> dict:
        """Replace the planner options; return the previous ones."""
        previous, self.planner_options = self.planner_options, dict(options)
        self._changed("planner_options", reason)
        return previous

    def set_dtype(self, dtype: str | None, *, reason: str = "") -> str | None:
        previous, self.dtype = self.dtype, dtype
        self._changed("dtype", reason)
        return previous

    def set_precision_map(self, precision_map: Mapping[str, str], *, reason: str = "") -> dict:
        """Replace the precision map; return the previous one."""
        previous, self.precision_map = self.precision_map, _check_precision_map(precision_map)
        self._changed("precision_map", reason, names=sorted(set(previous) ^ set(precision_map)))
        return dict(previous)

    def mark_clean(self) -> None:
        """Say the document matches what was opened or saved (``dirty`` means changed since).

        ``save`` calls it; a view calls it after opening a model or restoring a session, and
        when its undo history returns to that state. Notifies ``dirty`` when it was dirty.
        """
        if self.dirty:
            self.dirty = False
            self._notify(SessionChange(what="dirty"))

    def mark_dirty(self, reason: str = "") -> None:
        """Say the document holds work no file has (a session recovered after a crash).

        Notifies ``dirty`` when it was clean; the next ``save`` or ``mark_clean`` clears it.
        """
        if not self.dirty:
            self.dirty = True
            self._notify(SessionChange(what="dirty", reason=reason))

    # -- persistence -----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready document (the opened model is not included)."""
        return {
            "format": SESSION_FORMAT,
            "version": SESSION_VERSION,
            "source": self.source,
            "dtype": self.dtype,
            "device_map": dict(self.device_map),
            "budgets": [[device, nbytes] for device, nbytes in self.budgets.items()],
            "reserve": self.reserve,
            "memory": None if self.memory is None else self.memory.to_dict(),
            "planner_options": self.planner_options,
            "profile": _profile_to_json(self.profile),
            "precision_map": dict(self.precision_map),
        }

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write the session to ``path`` (default: where it was last saved) atomically.

        Raises:
            ValueError: when no path is given and the session was never saved.
            TypeError: when ``planner_options`` holds values JSON cannot store.
        """
        target = Path(path) if path is not None else self.path
        if target is None:
            raise ValueError("Session.save needs a path the first time")
        # "format" stays first (no sort_keys), so file managers and ``file`` can sniff it
        text = json.dumps(self.to_dict(), indent=2)
        atomic_write_text(target, text + "\n")
        self.path = target
        self.mark_clean()
        return target

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, origin: str = "<dict>") -> Session:
        """Build a session from ``to_dict()`` output.

        Raises:
            SessionFileError: naming ``origin`` and the bad field.
        """
        if not isinstance(data, Mapping) or data.get("format") != SESSION_FORMAT:
            raise SessionFileError(
                f'{origin}: not a workbench session (expected "format": "{SESSION_FORMAT}")'
            )
        version = data.get("version")
        if not isinstance(version, int) or version > SESSION_VERSION:
            raise SessionFileError(
                f"{origin}: session version {version!r} is not supported (this build reads up "
                f"to {SESSION_VERSION}); upgrade the workbench"
            )
        _check_field_types(data, origin)
        try:
            budgets = {  # the one size parser: 1e400, NaN and -1 are named errors
                device: convert_file_size_to_int(nbytes)
                for device, nbytes in data.get("budgets") or []
            }
            session = cls(
                source=data.get("source"),
                device_map=data.get("device_map") or {},
                budgets=budgets,
                reserve=int(data.get("reserve") or 0),
                planner_options=data.get("planner_options") or {},
                dtype=data.get("dtype"),
                profile=_profile_from_json(data.get("profile")),
                precision_map=data.get("precision_map") or {},
                memory=_memory_from_json(data.get("memory"), origin),
            )
        except (TypeError, ValueError) as exc:
            raise SessionFileError(f"{origin}: malformed session field: {exc}") from exc
        return session

    @classmethod
    def restore(cls, path: str | os.PathLike[str]) -> Session:
        """Read a session saved with ``save``; the result is clean and remembers ``path``.

        Raises:
            FileNotFoundError: when ``path`` does not exist.
            SessionFileError: when the file is not a valid session.
        """
        target = Path(path)
        data = read_json(
            target,
            what="a workbench session",
            fix="Open another session, or delete this file.",
            error=SessionFileError,
            max_nbytes=64 * 2**20,  # a session holds one map: 64 MiB is a 1M-key map
        )
        session = cls.from_dict(data, origin=str(target))
        session.path = target
        return session


_FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "source": ((str,), "a string"),
    "dtype": ((str,), "a string"),
    "device_map": ((dict,), "an object"),
    "budgets": ((list,), "a list of [device, bytes] pairs"),
    "reserve": ((int,), "an integer"),
    "memory": ((dict,), "an object"),
    "planner_options": ((dict,), "an object"),
    "profile": ((dict,), "an object"),
    "precision_map": ((dict,), "an object"),
}


def _check_field_types(data: Mapping[str, Any], origin: str) -> None:
    """Raise ``SessionFileError`` naming the first field of the wrong JSON type (null is fine)."""
    for name, (types, expected) in _FIELD_TYPES.items():
        value = data.get(name)
        if value is None:
            continue
        if not isinstance(value, types) or isinstance(value, bool):
            raise SessionFileError(
                f'{origin}: field "{name}" must be {expected} or null, '
                f"got {type(value).__name__} {value!r:.60}"
            )
    for index, pair in enumerate(data.get("budgets") or []):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise SessionFileError(
                f'{origin}: field "budgets" item {index} must be a [device, bytes] pair, '
                f"got {pair!r:.60}"
            )


def _check_memory(memory: Any) -> MemoryOptions | None:
    if memory is not None and not isinstance(memory, MemoryOptions):
        raise BadInputError(f"memory options must be MemoryOptions, got {type(memory).__name__}")
    return memory


def _memory_from_json(value: Any, origin: str) -> MemoryOptions | None:
    """The ``"memory"`` field (``None`` when absent: a file saved before it was stored)."""
    if value is None:
        return None
    try:
        return MemoryOptions.from_dict(value)
    except BadInputError as exc:
        raise SessionFileError(f'{origin}: field "memory": {exc}') from None


def _check_precision_map(precision_map: Mapping[str, Any]) -> dict[str, str]:
    if not isinstance(precision_map, Mapping):
        raise SessionFileError(
            f"a precision map must be an object, got {type(precision_map).__name__}"
        )
    wrong = sorted(
        repr(k) for k, v in precision_map.items() if not (isinstance(k, str) and isinstance(v, str))
    )
    if wrong:
        raise SessionFileError(
            f"a precision map takes module names to precision names (strings); "
            f"{len(wrong)} entries are not: {', '.join(wrong[:10])}"
        )
    return dict(precision_map)


def _is_under(name: str, prefix: str) -> bool:
    return prefix in ("", name) or name.startswith(prefix + ".")


def _normalize_map(device_map: Mapping[str, object]) -> DeviceDict:
    if not isinstance(device_map, Mapping):
        raise SessionFileError(f"a device map must be an object, got {type(device_map).__name__}")
    return normalize_device_map(device_map)  # type: ignore[arg-type]


def _normalize_budgets(budgets: Mapping[object, int]) -> dict[int | str, int]:
    return {normalize_device(k): int(v) for k, v in budgets.items()}  # type: ignore[arg-type]


def _profile_to_json(profile: Any) -> Any:
    if profile is None:
        return None
    to_dict = getattr(profile, "to_dict", None)
    if callable(to_dict):
        data = to_dict()
    elif dataclasses.is_dataclass(profile) and not isinstance(profile, type):
        data = dataclasses.asdict(profile)
    else:
        data = None
    return {"name": getattr(profile, "name", None), "data": data}


def _profile_from_json(value: Any) -> Any:
    """Rebuild a ``HardwareProfile``; falls back to the named profile, else ``None``."""
    if not value:
        return None
    data, name = value.get("data"), value.get("name")
    cls = getattr(hardware, "HardwareProfile", None)
    from_dict = getattr(cls, "from_dict", None)
    if data is not None:
        try:
            if callable(from_dict):
                return from_dict(data)
            # ``to_dict`` writes what ``load_profile`` reads from a .json path
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "profile.json"
                path.write_text(json.dumps(data), encoding="utf-8")
                return hardware.load_profile(path)
        except Exception:
            logger.warning("saved hardware profile could not be rebuilt; trying %r", name)
    if name:
        try:
            return hardware.load_profile(name)
        except Exception:
            logger.warning("hardware profile %r is not available; profile cleared", name)
    return None
