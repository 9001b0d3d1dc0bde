"""What the worker reports when things go wrong: bad files, warnings, a segfault (real processes)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
from job_holds import hold_options
from safetensors.torch import load_file, save_file

from workbench.runtime.protocol import Failed, Log, Phase, Result, WorkerExited
from workbench.runtime.worker import WorkerHost


def _copy(demo_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(demo_dir, tmp_path / "model"))


@pytest.mark.slow
def test_a_truncated_shard_fails_naming_the_file_with_details(
    host: WorkerHost, events: Any, demo_dir: Path, tmp_path: Path
) -> None:
    folder = _copy(demo_dir, tmp_path)
    shard = sorted(folder.glob("*.safetensors"))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    load_id = host.load(folder, {"": "cpu"}, dtype="float32")
    failed = events.final(load_id)
    assert isinstance(failed, Failed) and failed.kind == "bad_input", failed
    assert str(shard) in failed.message and "truncated" in failed.message
    assert "last phase: building" in failed.details
    assert "Traceback" in failed.details and "CheckpointError" in failed.details
    assert host.state == "idle" and host.is_alive()


@pytest.mark.slow
def test_engine_warnings_reach_the_host_as_log_events(
    host: WorkerHost, events: Any, demo_dir: Path, tmp_path: Path
) -> None:
    folder = _copy(demo_dir, tmp_path)
    shard = sorted(folder.glob("*.safetensors"))[-1]
    tensors = load_file(str(shard))
    assert "model.norm.weight" in tensors, sorted(tensors)
    del tensors["model.norm.weight"]  # the index still names it: a key missing from the file
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index_file = folder / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    del index["weight_map"]["model.norm.weight"]  # keep the index consistent with the shard
    index_file.write_text(json.dumps(index))
    load_id = host.load(folder, {"": "cpu"}, dtype="float32")
    failed = events.final(load_id)  # the weight stays on meta, so dispatch refuses the map
    assert isinstance(failed, Failed) and "model.norm.weight" in failed.message, failed
    warned = [
        e
        for e in events.of("Log")
        if isinstance(e, Log)
        and "UserWarning" in e.message
        and "not in the checkpoint" in e.message
    ]
    assert warned, [e.message for e in events.of("Log")]
    assert warned[0].level == logging.WARNING and "model.norm.weight" in warned[0].message


@pytest.mark.slow
def test_a_segfault_is_reported_with_the_signal_and_a_new_load_works(
    host: WorkerHost, events: Any, demo_dir: Path, cpu_disk_map: dict
) -> None:
    load_id = host.load(demo_dir, cpu_disk_map, dtype="float32", options=hold_options(5))
    folder = host.offload_folder
    events.wait_for(
        lambda e: isinstance(e, Phase) and e.request_id == load_id and e.phase == "held"
    )
    pid = host.pid
    os.kill(pid, signal.SIGSEGV)
    exited = events.wait_for(lambda e: isinstance(e, WorkerExited))
    assert exited.signal == signal.SIGSEGV and not exited.expected
    failed = events.final(load_id)
    assert isinstance(failed, Failed) and failed.kind == "worker_died"
    assert "killed by signal 11 (SIGSEGV)" in failed.details
    assert "last phase: held" in failed.details and "last tensor: model." in failed.details
    assert not folder.exists()

    again = host.load(demo_dir, {"": "cpu"}, dtype="float32")
    assert isinstance(events.final(again), Result)
    assert host.pid != pid and host.state == "loaded"
