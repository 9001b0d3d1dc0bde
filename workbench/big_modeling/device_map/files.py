"""Device-map files: save and load a device map as JSON, plain or wrapped with a model record.

The file is the exact ``{"module.name": device}`` JSON that transformers and Accelerate accept
(devices as ints for GPUs, ``"cpu"``, ``"disk"``, ``"mps"``; ``"cuda:1"`` is read as ``1``).
``save_device_map(..., **metadata)`` writes a wrapped form that also loads::

    {"format": "workbench-device-map", "version": 1, "model": {...}, "device_map": {...}}

Overlapping keys: in memory (``check_device_map``) the most specific key wins, as in
transformers (``{"": "cpu", "layers.0": 0}`` puts ``layers.0`` on GPU 0). In *files* a key and
one of its ancestors naming different devices is rejected, because loaders disagree on which
wins (transformers applies keys in order, Accelerate's dispatch by depth); the same device twice
is accepted. Identical keys (duplicates) are always an error.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from workbench.big_modeling.atomic import atomic_write_text
from workbench.big_modeling.device_map.coverage import resolve_device_map
from workbench.big_modeling.device_map.value import normalize_device_map
from workbench.big_modeling.devices import Device, DeviceValue, normalize_device
from workbench.big_modeling.errors import BadInputError, DeviceMapError
from workbench.big_modeling.json_files import read_json
from workbench.wording import plural

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_KEY_CHARS",
    "check_model_record",
    "load_device_map",
    "model_record_differences",
    "read_device_map",
    "save_device_map",
]

FORMAT_NAME = "workbench-device-map"
FORMAT_VERSION = 1
MAX_KEY_CHARS = 4096  # the longest module names of real models are ~100 characters


def _listing(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(repr(name) for name in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def save_device_map(
    path: str | Path,
    device_map: Mapping[str, DeviceValue],
    *,
    quantization: Mapping[str, Any] | None = None,
    **metadata: Any,
) -> None:
    """Write ``device_map`` as JSON, atomically (temp file + rename).

    Without metadata the file is the plain ``{"module.name": device}`` map transformers and
    Accelerate read; with metadata (a model fingerprint: name, parameter count, dtype...) it is
    ``{"format": "workbench-device-map", "version": 1, "model": metadata, "device_map": ...}``,
    plus ``"quantization": {...}`` (precision map, kept modules) when ``quantization`` is given.

    Raises:
        DeviceMapError: for values that are not devices.
        BadInputError: for metadata JSON cannot hold.

    Example:
        >>> save_device_map("map.json", {"": 0}, name="llama-3-8b")  # doctest: +SKIP
    """
    try:
        normalized = normalize_device_map(device_map)
    except DeviceMapError as error:
        raise DeviceMapError(f"{path}: {error}") from None
    document: Any = normalized
    if metadata:
        document = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "model": metadata,
            "device_map": normalized,
        }
        if quantization:
            document["quantization"] = dict(quantization)
    try:
        text = json.dumps(document, indent=2)
    except (TypeError, ValueError) as error:
        raise BadInputError(f"{path}: metadata cannot be written as JSON: {error}") from None
    atomic_write_text(path, text + "\n")


def load_device_map(path: str | Path, model: nn.Module | None = None) -> dict[str, Device]:
    """Read a device-map file (plain or wrapped form) and return ``{name: device}``.

    Devices come back canonical (``"cuda:1"`` -> ``1``). With ``model``, the map is also
    checked against it (``resolve_device_map``): unknown names and uncovered tensors are errors.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        DeviceMapError: naming the file and the problem: invalid JSON (line and column),
            duplicate keys, a wrong format or version, values that are not devices, malformed,
            too long or contradictory keys, a wrapped map recorded for another model (see
            ``check_model_record``), names not in the model, uncovered tensors.

    Example:
        >>> load_device_map("map.json")  # doctest: +SKIP
        {'model.embed_tokens': 0, 'model.layers': 'cpu', 'lm_head': 'disk'}
    """
    path = Path(path)
    reading = read_device_map(path)
    if reading.bad_devices:
        raise DeviceMapError(f"{path}: {reading.bad_devices_message()}")
    device_map = reading.device_map
    if model is not None:
        if reading.model_record is not None:
            check_model_record(reading.model_record, model, source=path)
        try:
            resolve_device_map(model, device_map)  # strict: unknown names are errors here
        except DeviceMapError as error:
            raise DeviceMapError(f"{path}: {error}") from None
    return device_map


@dataclass(frozen=True)
class DeviceMapReading:
    """A device-map file as read, with the entries whose value is not a device set apart.

    Attributes:
        path: the file.
        device_map: the entries with a valid device, canonical (``"cuda:1"`` -> ``1``).
        bad_devices: ``{key: value as written}`` for entries that do not name a device.
        model_record: the wrapped form's ``"model"`` object (the fingerprint of the model the
            map was made for), ``None`` for a plain map.
    """

    path: Path
    device_map: dict[str, Device]
    bad_devices: dict[str, Any] = field(default_factory=dict)
    model_record: dict[str, Any] | None = None

    def bad_devices_message(self) -> str:
        """Say which entries do not name a device and what a device looks like."""
        listed = ", ".join(sorted(f"{k!r}: {json.dumps(v)}" for k, v in self.bad_devices.items()))
        count = len(self.bad_devices)
        return (
            f"{plural(count, 'entry')} {'does' if count == 1 else 'do'} not name a device: "
            f"{listed}. "
            "Use an int GPU index, 'cpu', 'disk', 'mps' or 'cuda:N'."
        )


def read_device_map(path: str | Path) -> DeviceMapReading:
    """Read a device-map file like ``load_device_map`` but keep going past bad devices.

    Entries whose value is not a device are returned in ``bad_devices`` instead of raising, so
    a caller (the GUI's import dialog) can list them together with the file's other problems.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        DeviceMapError: naming the file: not UTF-8 text, invalid JSON (line and column),
            duplicate keys, a wrong format or version, malformed or contradictory keys.

    Example:
        >>> read_device_map("map.json").bad_devices  # doctest: +SKIP
        {'lm_head': 'gpu0'}
    """
    path = Path(path)
    try:
        document = read_json(
            path,
            what="a device map (a JSON object of module names to devices)",
            fix="Fix the file or export the map again.",
            error=DeviceMapError,
            object_pairs_hook=_reject_duplicates,
        )
    except _DuplicateKeys as error:
        raise DeviceMapError(
            f"{path}: duplicate keys {_listing(error.keys)}; give each module once"
        ) from None
    raw_map, record = _unwrap(path, document)
    device_map, bad_devices = _parse_entries(path, raw_map)
    return DeviceMapReading(path, device_map, bad_devices, record)


class _DuplicateKeys(Exception):
    def __init__(self, keys: list[str]) -> None:
        super().__init__(keys)
        self.keys = keys


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    duplicates = sorted({key for key, _ in pairs if key in seen or seen.add(key)})
    if duplicates:
        raise _DuplicateKeys(duplicates)
    return dict(pairs)


def _unwrap(path: Path, document: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    if not isinstance(document, dict):
        raise DeviceMapError(
            f"{path}: expected a JSON object of module names to devices, found {type(document).__name__}"
        )
    if "format" not in document or "device_map" not in document:
        return document, None
    if document["format"] != FORMAT_NAME:
        raise DeviceMapError(
            f"{path}: unknown format {document['format']!r}; expected {FORMAT_NAME!r}"
        )
    version = document.get("version")
    if version != FORMAT_VERSION:
        raise DeviceMapError(
            f"{path}: {FORMAT_NAME} version {version!r} is not supported; this workbench "
            f"reads version {FORMAT_VERSION}"
        )
    inner = document["device_map"]
    if not isinstance(inner, dict):
        raise DeviceMapError(
            f"{path}: 'device_map' must be an object, found {type(inner).__name__}"
        )
    record = document.get("model")
    if record is not None and not isinstance(record, dict):
        raise DeviceMapError(
            f"{path}: 'model' must be an object (the model fingerprint), found "
            f"{type(record).__name__}; remove it or export the map again"
        )
    return inner, record or None


def model_record_differences(
    record: Mapping[str, Any], *, class_name: str, param_count: int
) -> list[str]:
    """What differs between a wrapped map's ``"model"`` record and a model, one line each.

    Only the fields that identify the model are compared: its class (``"class"``) and its
    parameter count (``"param_count"``); fields the record lacks are not compared (a record
    written by hand may name only one). The source path and dtype may differ legitimately.

    Example:
        >>> model_record_differences({"class": "GPT2LMHeadModel"}, class_name="LlamaForCausalLM",
        ...     param_count=10)
        ["class: the map was made for GPT2LMHeadModel, this model is LlamaForCausalLM"]
    """
    differences = []
    recorded_class = record.get("class")
    if isinstance(recorded_class, str) and recorded_class and recorded_class != class_name:
        differences.append(
            f"class: the map was made for {recorded_class}, this model is {class_name}"
        )
    recorded_count = record.get("param_count")
    if (
        isinstance(recorded_count, int)
        and not isinstance(recorded_count, bool)
        and recorded_count != param_count
    ):
        differences.append(
            f"param_count: the map was made for {recorded_count:,} parameters, this model has "
            f"{param_count:,}"
        )
    return differences


def check_model_record(
    record: Mapping[str, Any], model: nn.Module, *, source: object = "device_map"
) -> None:
    """Refuse a wrapped map whose ``"model"`` record describes another model.

    Raises:
        DeviceMapError: naming ``source``, each field that differs, and the two ways out:
            export the map again for this model, or use the plain ``"device_map"`` object.

    Example:
        >>> check_model_record({"class": "Linear", "param_count": 6}, nn.Linear(2, 2))
        Traceback (most recent call last):
        ...
        workbench.big_modeling.errors.DeviceMapError: device_map: made for another model (param_count: the map was made for 6 parameters, this model has 6... (truncated)
    """
    param_count = sum(parameter.numel() for parameter in model.parameters())
    differences = model_record_differences(
        record, class_name=type(model).__name__, param_count=param_count
    )
    if differences:
        raise DeviceMapError(
            f"{source}: made for another model ({'; '.join(differences)}). Export the map "
            "again for this model, or, to use it anyway, load its plain 'device_map' object."
        )


def _parse_entries(path: Path, raw_map: dict[str, Any]) -> tuple[dict[str, Device], dict[str, Any]]:
    device_map: dict[str, Device] = {}
    bad_devices: dict[str, Any] = {}
    bad_keys = []
    long_keys = sorted(key for key in raw_map if len(key) > MAX_KEY_CHARS)
    if long_keys:
        raise DeviceMapError(
            f"{path}: {len(long_keys)} keys are longer than {MAX_KEY_CHARS} characters "
            f"(the first starts {long_keys[0][:40]!r}, {len(long_keys[0])} characters); "
            "module names are dotted names like 'model.layers.0'"
        )
    for key, value in raw_map.items():
        empty_part = key.startswith(".") or key.endswith(".") or ".." in key  # C-speed scans
        if key and (key != key.strip() or empty_part):
            bad_keys.append(key)
        if isinstance(value, int | str) and not isinstance(value, bool):
            try:
                device_map[key] = normalize_device(value)
                continue
            except DeviceMapError:
                pass
        bad_devices[key] = value
    if bad_keys:
        raise DeviceMapError(
            f"{path}: malformed module names {_listing(sorted(bad_keys))}; use dotted names "
            "like 'model.layers.0' (or '' for the whole model)"
        )
    contradictions = _contradictions(device_map)
    if contradictions:
        raise DeviceMapError(
            f"{path}: overlapping keys give different devices: {'; '.join(sorted(contradictions))}. "
            "Loaders disagree on which wins; list the parts separately instead of their parent."
        )
    return device_map, bad_devices


def _contradictions(device_map: dict[str, Device]) -> list[str]:
    """``"'a' -> 0 vs 'a.b' -> 'cpu'"`` for each key whose nearest keyed ancestor differs.

    An ancestor of ``key`` is a prefix ending just before one of its dots, so only prefixes
    whose length is some key's length can be keys. Per key this visits the fewer of its dots
    and the distinct key lengths, longest first, and stops at the nearest ancestor; the old
    walk rebuilt every prefix with ``rpartition`` (quadratic: 15 s for a 0.4 MB key).
    """
    lengths = {len(key) for key in device_map}
    longest_first = sorted(lengths, reverse=True)
    found = []
    for key, device in device_map.items():
        if not key:
            continue
        if len(longest_first) <= key.count("."):
            ends: Iterable[int] = (n for n in longest_first if n < len(key) and key[n] == ".")
        else:
            ends = (n for n in _dots_from_the_right(key) if n in lengths)
        candidates = itertools.chain((key[:end] for end in ends), [""])
        for parent in candidates:
            if parent in device_map:
                if device_map[parent] != device:
                    found.append(f"{parent!r} -> {device_map[parent]!r} vs {key!r} -> {device!r}")
                break
    return found


def _dots_from_the_right(key: str) -> Iterator[int]:
    position = key.rfind(".")
    while position != -1:
        yield position
        position = key.rfind(".", 0, position)
