"""``make-demo --overwrite`` killed while it replaces the folder leaves the old demo or the new.

A real process and a real SIGKILL: the child makes a demo over an existing one and kills itself
in the middle of the first folder removal (after one file is gone). The old code removed the
target first (``rmtree(target)`` then ``os.replace``), which left 9 of 10 old files and the new
copy stranded in ``.demo.*.tmp``; now the old folder is removed only after the new one is in
place, so the target is the whole new demo.
"""

from __future__ import annotations

import filecmp
import signal
import subprocess
import sys
from pathlib import Path

from workbench.models.demo import make_demo

CHILD = """
import os, shutil, signal, sys
real_rmtree = shutil.rmtree
def rmtree_then_die(path, *args, **kwargs):
    if os.path.isdir(path):
        first = sorted(name for name in os.listdir(path))[0]
        os.unlink(os.path.join(path, first))  # the removal has started...
        os.kill(os.getpid(), signal.SIGKILL)  # ...and the process dies mid-way
    return real_rmtree(path, *args, **kwargs)
shutil.rmtree = rmtree_then_die
from workbench.models.demo import make_demo
make_demo(sys.argv[1], arch="llama", params="1M", shards=3, seed=1, overwrite=True)
"""


def test_killed_overwrite_leaves_the_whole_new_demo(tmp_path: Path) -> None:
    target = tmp_path / "demo"
    make_demo(target, arch="llama", params="1M", shards=3, seed=0)
    expected = make_demo(tmp_path / "expected", arch="llama", params="1M", shards=3, seed=1)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(target)], capture_output=True, text=True, check=False
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    names = sorted(path.name for path in expected.iterdir())
    assert sorted(path.name for path in target.iterdir()) == names
    match, mismatch, errors = filecmp.cmpfiles(target, expected, names, shallow=False)
    assert (mismatch, errors) == ([], []) and len(match) == len(names)
    # the next --overwrite sweeps the half-deleted old copy the kill left beside it
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".old")]
    make_demo(target, arch="llama", params="1M", shards=3, seed=1, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo", "expected"]
