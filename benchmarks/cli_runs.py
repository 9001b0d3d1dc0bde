"""``workbench`` CLI runs in fresh processes, of the same code the benchmark imported.

``python -m workbench`` puts the current folder first on ``sys.path``: started from this
checkout with ``PYTHONPATH`` naming a baseline tree, the child ran this checkout's code while
the parent imported the baseline's (a side-by-side comparison measured one revision twice).
``workbench_command`` runs the child from the folder holding the ``workbench`` package the
benchmark imported, so both sides run one revision.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import workbench

WORKBENCH_TREE = Path(workbench.__file__).resolve().parents[1]
"""The folder holding the imported ``workbench`` package."""


def run_workbench(
    args: Sequence[str], *, env: Mapping[str, str] | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """``python -m workbench ARGS`` in a fresh process of the imported revision."""
    return subprocess.run(
        [sys.executable, "-m", "workbench", *args],
        capture_output=True,
        text=True,
        check=check,
        cwd=WORKBENCH_TREE,
        env=None if env is None else dict(env),
    )
