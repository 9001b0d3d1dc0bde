"""The one JSON reader: limits, one error shape (file, what, fix), the caller's error type."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.big_modeling.errors import BadInputError, CheckpointError
from workbench.big_modeling.json_files import (
    MAX_JSON_DEPTH,
    JsonFileError,
    parse_json,
    read_json,
)


def _read(path: Path, **kwargs):
    return read_json(path, what="a test file", fix="Fix it.", **kwargs)


def test_reads_objects_and_strips_a_bom(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b'\xef\xbb\xbf{"a": [1, {"b": null}]}')
    assert _read(path) == {"a": [1, {"b": None}]}


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b'{"a": 1,}', r"not valid JSON \(line 1, column 9: Expecting property name"),
        (b"\xff{}", r"not UTF-8 text \(byte 0xff at offset 0\)"),
        (b"[" * 100_000 + b"]" * 100_000, f"nested more than {MAX_JSON_DEPTH} levels deep"),
        (b"[" * 65 + b"]" * 65, f"nested more than {MAX_JSON_DEPTH} levels deep"),
        (b"[" + b"7" * 5000 + b"]", r"not usable JSON \(Exceeds the limit \(4300 digits\)"),
    ],
    ids=["syntax", "not-utf8", "deep-recursion", "deep-65", "long-int"],
)
def test_each_problem_has_one_shape(tmp_path: Path, data: bytes, problem: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(data)
    with pytest.raises(JsonFileError, match=problem) as caught:
        _read(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and message.endswith("; expected a test file. Fix it.")
    assert isinstance(caught.value, BadInputError)


def test_64_levels_are_allowed(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_bytes(b"[" * 64 + b"]" * 64)
    assert _read(path) is not None


def test_size_limit_refuses_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with path.open("wb") as handle:
        handle.truncate(2_000)
    with pytest.raises(JsonFileError, match="too big: 2000 bytes, above the 1000-byte limit"):
        _read(path, max_nbytes=1000)


def test_a_device_file_that_never_ends_is_cut_at_the_limit() -> None:
    # /dev/zero reports size 0 and never ends: reading stops one byte past the limit
    with pytest.raises(JsonFileError, match="too big: above the 1000-byte limit"):
        _read(Path("/dev/zero"), max_nbytes=1000)


def test_folders_unreadable_files_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(JsonFileError, match=r": is a directory; expected a test file"):
        _read(tmp_path)
    with pytest.raises(FileNotFoundError):
        _read(tmp_path / "nope.json")


def test_the_callers_error_type_is_raised(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("{")
    with pytest.raises(CheckpointError, match=r"x\.json: not valid JSON"):
        _read(path, error=CheckpointError)
    with pytest.raises(CheckpointError, match=r"^inline: not valid JSON"):
        parse_json("{", source="inline", what="a test", fix="", error=CheckpointError)
