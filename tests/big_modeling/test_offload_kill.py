"""A load SIGKILLed while it commits into an offload folder leaves the old weights or the new.

Real processes and real signals: the child (``offload_kill_child.py``) kills itself with
SIGKILL just before a chosen ``os.replace`` / ``os.link`` / ``os.unlink`` of the commit, so each
test hits one exact step. Before the fix the folder kept the old, valid ``index.json`` over a mix
of new and old ``.dat`` files of identical sizes, and hidden temp files stayed forever.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench.big_modeling.errors import CheckpointError
from workbench.big_modeling.loading.offload_staging import OffloadStager
from workbench.big_modeling.offload.folder import (
    OffloadedWeightsLoader,
    load_offload_index,
    offload_state_dict,
)

CHILD = Path(__file__).with_name("offload_kill_child.py")
sys.path.insert(0, str(CHILD.parent))
from offload_kill_child import NAMES, weights  # noqa: E402

OLD, NEW = weights(1.0), weights(100.0)


def _killed_commit(folder: Path, writer: str, call: str, n: int) -> None:
    offload_state_dict(folder, OLD)
    done = subprocess.run(
        [sys.executable, str(CHILD), str(folder), writer, call, str(n)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr


def _files(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def _read_all(folder: Path) -> dict[str, torch.Tensor]:
    assert sorted(load_offload_index(folder)) == sorted(NAMES)
    loader = OffloadedWeightsLoader(save_folder=folder, map_cache_bytes=0)
    return {name: loader[name].clone() for name in NAMES}


def _assert_one_load(folder: Path, expected: dict[str, torch.Tensor]) -> None:
    found = _read_all(folder)
    for name in NAMES:
        torch.testing.assert_close(found[name], expected[name], rtol=0, atol=0)
    OffloadStager.open(folder).abort()  # a writer's open sweeps what the killed one left
    assert _files(folder) == sorted([*(f"{n}.dat" for n in NAMES), "index.json"])


# os.replace calls of a 5-file commit: 0 the journal, 1-5 the data files, 6 the index (the
# commit point); os.link 0-4 keep the old files aside; os.unlink 0 comes after the commit point.
@pytest.mark.parametrize(
    ("call", "n", "survivor"),
    [
        ("replace", 0, "old"),  # before the journal lands: only staged temp files exist
        ("replace", 1, "old"),  # first old file kept aside (the kill point)
        ("replace", 3, "old"),  # two new files in place, three old
        ("replace", 6, "old"),  # every file swapped, the index not yet
        ("unlink", 0, "new"),  # the new index landed; the kept copies not yet dropped
    ],
)
def test_kill_during_commit_leaves_old_or_new_never_a_mix(
    tmp_path: Path, call: str, n: int, survivor: str
) -> None:
    folder = tmp_path / "offload"
    _killed_commit(folder, "state_dict", call, n)
    _assert_one_load(folder, OLD if survivor == "old" else NEW)


def test_kill_during_a_stager_commit_is_rolled_back(tmp_path: Path) -> None:
    folder = tmp_path / "offload"
    _killed_commit(folder, "stager", "replace", 3)
    assert any(name.endswith(".old") for name in _files(folder))  # the kill left a half commit
    _assert_one_load(folder, OLD)


def test_a_tampered_journal_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "offload"
    _killed_commit(folder, "state_dict", "replace", 3)
    journal = folder / ".commit-journal.json"
    journal.write_text(
        '{"index": "index.json", "index_sha256": "0", "moves": [["../x", "a", "b", true]]}'
    )
    with pytest.raises(CheckpointError, match="not a commit journal this workbench wrote"):
        load_offload_index(folder)
