"""Offload folders carry their owner's pid; a new host sweeps the folders of dead owners."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
