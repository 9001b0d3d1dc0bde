"""Offload folders carry their owner's pid; a new host sweeps the folders of dead owners."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.big_modeling.errors import OffloadError
from workbench.runtime.offload_folders import (
    new_offload_folder,
    owner_pid,
    sweep_stale_offload_folders,
)
from workbench.runtime.worker import WorkerHost


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # exited and reaped: the pid names no process now
    return child.pid


def test_only_folders_of_dead_owners_are_swept(tmp_path: Path) -> None:
    dead = new_offload_folder(tmp_path, pid=_dead_pid())
    (dead / "model.layers.1.weight.dat").write_bytes(b"\0" * 16)
    live = new_offload_folder(tmp_path, pid=os.getppid())  # our parent runs, and started first
    mine = new_offload_folder(tmp_path)
    other = tmp_path / "workbench-offload-notapid"
    other.mkdir()
    assert owner_pid(mine) == os.getpid() and owner_pid(other) is None
    assert sweep_stale_offload_folders(tmp_path) == [dead]
    assert not dead.exists()
    assert live.exists() and mine.exists() and other.exists()
    assert sweep_stale_offload_folders(tmp_path / "missing") == []


def test_a_starting_host_sweeps_what_a_dead_host_left(tmp_path: Path, events: object) -> None:
    left = new_offload_folder(tmp_path, pid=_dead_pid())
    host = WorkerHost(events, offload_root=tmp_path, preload_imports=False)  # type: ignore[arg-type]
    try:
        host.start()
        assert not left.exists()
    finally:
        host.shutdown(timeout_s=60)


def test_an_unusable_offload_root_says_which_folder_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("WORKBENCH_OFFLOAD_DIR", str(blocker / "sub"))
    with pytest.raises(OffloadError) as caught:
        new_offload_folder(None)
    message = str(caught.value)
    assert str(blocker / "sub") in message and "$WORKBENCH_OFFLOAD_DIR" in message
    assert "Not a directory" in message and "writable folder" in message
    assert "[Errno" not in message  # a sentence, not a bare OS error


def test_a_host_whose_offload_root_is_unusable_starts_no_worker(
    tmp_path: Path, events: object
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    host = WorkerHost(events, offload_root=blocker / "sub", preload_imports=False)  # type: ignore[arg-type]
    try:
        with pytest.raises(OffloadError, match="cannot create the offload folder under"):
            host.load(tmp_path / "model", {"": "cpu"})
        assert host.pid is None and host.state == "stopped" and host.offload_folder is None
    finally:
        host.shutdown(timeout_s=60)
