"""The entry point: version, help, exit codes."""

from __future__ import annotations

import subprocess
import sys

import workbench
from workbench.cli import main


def test_version_flag_prints_version(capsys) -> None:
    try:
        main(["--version"])
    except SystemExit as stop:
        assert stop.code == 0
    assert workbench.__version__ in capsys.readouterr().out


def test_python_dash_m_runs_the_cli() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "workbench", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0
    assert "usage: workbench" in result.stdout
