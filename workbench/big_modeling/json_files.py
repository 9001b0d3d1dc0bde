"""The one JSON reader of the project: size and depth limits, one error shape.

Every JSON file the workbench reads (device maps, configs, checkpoint and offload indexes,
safetensors headers, hardware profiles, sessions, settings, catalogs, tokenizer files) goes
through ``read_json`` or ``parse_json``. A hostile or broken file always ends in one error,
of the caller's type, that names the file, what is wrong and how to fix it::

    m.json: not valid JSON (line 3, column 5: Expecting ',' delimiter); expected a device
    map. Fix the file or export it again.

Limits: ``max_nbytes`` (100 MiB by default, the safetensors header cap) and ``max_depth``
(64 levels). Deep nesting never escapes as ``RecursionError`` and huge integer literals never
escape as a bare ``ValueError``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.big_modeling.errors import BadInputError

__all__ = ["MAX_JSON_DEPTH", "MAX_JSON_NBYTES", "JsonFileError", "parse_json", "read_json"]

MAX_JSON_NBYTES = 100 * 2**20  # 100 MiB, as the safetensors header cap
MAX_JSON_DEPTH = 64  # configs nest ~5 levels, device maps 3, safetensors headers 3


class JsonFileError(BadInputError):
    """A JSON file that cannot be read, is too big or too deep, or is not valid JSON."""


def read_json(
    path: str | os.PathLike[str],
    *,
    what: str,
    fix: str,
    error: type[Exception] = JsonFileError,
    max_nbytes: int = MAX_JSON_NBYTES,
    max_depth: int = MAX_JSON_DEPTH,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """Read and parse the JSON file ``path`` within the size and depth limits.

    Args:
        path: the file.
        what: what the file should be, for the message (``"a device map"``).
        fix: one sentence saying how to fix the file (``"Export the map again."``).
        error: the exception type to raise (the caller's own, e.g. ``DeviceMapError``); it is
            called with one message argument.
        max_nbytes: files larger than this are refused before they are read.
        max_depth: documents nested deeper than this are refused.
        object_pairs_hook: passed to ``json.loads`` (e.g. to reject duplicate keys); an
            exception it raises propagates unchanged.

    Returns:
        The decoded document.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        error: naming the file, the problem and ``fix``: a folder instead of a file, a file
            that cannot be read, too big, not UTF-8, not JSON (line and column), too deep.

    Example:
        >>> read_json("config.json", what="a model config", fix="Re-download it.")  # doctest: +SKIP
        {'model_type': 'llama', ...}
    """
    file = Path(path)
    try:
        with open(file, "rb") as handle:
            nbytes = os.fstat(handle.fileno()).st_size
            if nbytes > max_nbytes:
                raise error(
                    _message(
                        file,
                        f"too big: {nbytes} bytes, above the {max_nbytes}-byte limit",
                        what,
                        fix,
                    )
                )
            data = handle.read(max_nbytes + 1)
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise error(_message(file, "is a directory", what, fix)) from None
    except OSError as exc:
        raise error(_message(file, f"cannot be read ({exc.strerror or exc})", what, fix)) from None
    if len(data) > max_nbytes:  # grew while being read (a pipe or a file being written)
        raise error(_message(file, f"too big: above the {max_nbytes}-byte limit", what, fix))
    return parse_json(
        data,
        source=file,
        what=what,
        fix=fix,
        error=error,
        max_depth=max_depth,
        object_pairs_hook=object_pairs_hook,
    )


def parse_json(
    data: bytes | str,
    *,
    source: object,
    what: str,
    fix: str,
    error: type[Exception] = JsonFileError,
    max_depth: int = MAX_JSON_DEPTH,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """Parse JSON ``data`` read from ``source`` (a file, or e.g. ``"x.safetensors header"``).

    Same errors and limits as ``read_json`` except the size limit, which the caller applies
    to what it reads.

    Example:
        >>> parse_json(b'{"a": [1, 2]}', source="inline", what="a test", fix="")
        {'a': [1, 2]}
    """
    if isinstance(data, bytes | bytearray):
        try:
            text = bytes(data).decode("utf-8-sig")  # a BOM, as Notepad writes, is not an error
        except UnicodeDecodeError as exc:
            problem = f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
            raise error(_message(source, problem, what, fix)) from None
    else:
        text = data.removeprefix("\ufeff")
    try:
        document = json.loads(text, object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as exc:
        problem = f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        raise error(_message(source, problem, what, fix)) from None
    except RecursionError:
        raise error(
            _message(source, f"nested more than {max_depth} levels deep", what, fix)
        ) from None
    except ValueError as exc:  # e.g. an integer literal of more than 4300 digits
        raise error(_message(source, f"not usable JSON ({exc})", what, fix)) from None
    if _depth_exceeds(document, max_depth):
        raise error(_message(source, f"nested more than {max_depth} levels deep", what, fix))
    return document


def _message(source: object, problem: str, what: str, fix: str) -> str:
    return f"{source}: {problem}; expected {what}." + (f" {fix}" if fix else "")


def _depth_exceeds(document: Any, max_depth: int) -> bool:
    """Whether containers nest deeper than ``max_depth`` (iterative: no recursion limit)."""
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth + 1 > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False
