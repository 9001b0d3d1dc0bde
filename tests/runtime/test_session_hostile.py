"""Hostile session files: each a ``SessionFileError`` naming the file, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.runtime.session import Session, SessionFileError


def _session_text(**fields: object) -> str:
    return json.dumps({"format": "workbench-session", "version": 1, **fields})


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        # Latin-1 text: UnicodeDecodeError escaped (only JSONDecodeError was caught)
        ('{"format": "workbench-session", "source": "caf\u00e8"}'.encode("latin-1"), "not UTF-8"),
        (
            b'{"format": "workbench-session", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            "nested",
        ),
        (_session_text(reserve=1).replace("1}", "1" * 5000 + "}").encode(), "not usable JSON"),
        # int(1e400) in the budgets raised OverflowError, which nothing caught
        (_session_text(budgets=[["cpu", 1e400]]).encode(), "above the limit of 1 EiB"),
        (_session_text(budgets=[["cpu", -5]]).encode(), "negative"),  # was accepted
        (_session_text(budgets=[["cpu", "\u0661GB"]]).encode(), "not a number with a known unit"),
        (_session_text(budgets=[["cpu"]]).encode(), r"must be a \[device, bytes\] pair"),
    ],
    ids=["latin-1", "deep", "long-int", "budget-1e400", "budget-negative", "budget-arabic", "pair"],
)
def test_hostile_sessions_are_named(tmp_path: Path, data: bytes, problem: str) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(data)
    with pytest.raises(SessionFileError, match=problem) as caught:
        Session.restore(path)
    assert str(caught.value).startswith(str(path))


def test_a_session_saved_by_notepad_with_a_bom_restores(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(b"\xef\xbb\xbf" + _session_text(budgets=[["cpu", 2**30]]).encode())
    assert Session.restore(path).budgets == {"cpu": 2**30}
