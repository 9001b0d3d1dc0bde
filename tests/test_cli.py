"""The entry point: version, help, exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from terminal import run_on_a_terminal

import workbench
from workbench.cli import main
from workbench.models.demo import DEMO_STAGES


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


@pytest.mark.slow  # a fresh interpreter imports torch and transformers
def test_progress_bars_are_drawn_on_a_terminal(tmp_path: Path) -> None:
    """stderr on a pseudo-terminal: make-demo and inspect draw tqdm bars naming each stage."""
    folder = tmp_path / "demo"
    script = (
        "import sys; from workbench.cli import main; "
        f"code = main(['make-demo', {str(folder)!r}, '--params', '500K', '--shards', '2']); "
        f"sys.exit(code or main(['inspect', {str(folder)!r}, '--depth', '0']))"
    )
    code, stdout, text = run_on_a_terminal([sys.executable, "-c", script], 300)
    assert code == 0, text
    for stage in (*DEMO_STAGES, "opening the demo"):
        assert f"making llama demo: {stage}:" in text, text
    for stage in ("reading config", "building empty model", "reading checkpoint headers"):
        assert f"opening {folder}: {stage}:" in text, text
    assert re.search(r"\d+%\|.*\| \d/\d \[", text), text  # tqdm's bar: 40%|####  | 2/5 [
    assert f"wrote LlamaForCausalLM demo to {folder}" in stdout and "LlamaDecoderLayer" in stdout
    assert "%|" not in stdout


@pytest.mark.slow  # a fresh interpreter imports torch and transformers
def test_inspect_plan_and_make_demo_never_touch_the_network(tmp_path: Path) -> None:
    """With HF_HUB_OFFLINE unset, every socket connect and name lookup raises and is recorded;
    the commands must succeed without one attempt (a swallowed attempt still counts)."""
    folder = tmp_path / "demo"
    commands = [
        ["make-demo", str(folder), "--params", "500K", "--shards", "2"],
        ["inspect", str(folder)],
        ["inspect", "gpt2", "--depth", "1"],
        ["inspect", "--list"],
        [
            "plan",
            str(folder),
            "--max-memory",
            "cpu=1MiB",
            "disk=1GiB",
            "--no-reserve",
            "--emit-code",
        ],
        ["plan", "llama-3.1-8b", "--profile", "rtx4090-64gb", "--json"],
    ]
    script = f"""
import json, socket, sys
attempts = []
def refuse(*args, **kwargs):
    attempts.append(repr(args)[:200])
    raise OSError("network blocked by the test")
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.getaddrinfo = refuse
socket.create_connection = refuse
from workbench.cli import main
codes = [main(argv) for argv in {commands!r}]
print("RESULT", json.dumps({{"codes": codes, "attempts": attempts}}))
"""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    }
    env["HF_HOME"] = str(tmp_path / "hf-home")  # an empty cache: nothing to find locally
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stderr
    line = next(row for row in result.stdout.splitlines() if row.startswith("RESULT "))
    outcome = json.loads(line.removeprefix("RESULT "))
    assert outcome == {"codes": [0] * len(commands), "attempts": []}, result.stderr
