"""Every command in README.md is run here (or, for the set-up commands, by `.ci/run`), every
JSON example loads, and every image it shows exists. A README command with no runner fails."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import APP_ID
from workbench.big_modeling.device_map import load_device_map
from workbench.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
SETUP, _, AFTER_SETUP = README.partition("\n## A short tour")
CLI_HEADING = "## The command line in five lines"


def fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def commands(block: str) -> list[str]:
    """Shell lines of a block, comments dropped, `a && b` split."""
    lines = [line.split(" #")[0].strip() for line in block.splitlines()]
    return [part.strip() for line in lines if line for part in line.split("&&")]


def section(heading: str) -> str:
    start = README.index(heading)
    end = README.find("\n## ", start + len(heading))
    return README[start : end if end != -1 else len(README)]


@pytest.fixture
def user_dirs(tmp_path, monkeypatch):
    """Run commands in a temp dir with their own settings, caches and data folders."""
    for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.delenv("WORKBENCH_CACHE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_setup_commands_are_the_ones_ci_runs():
    ci_script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    install_block, test_block = fenced_blocks(SETUP, "bash")
    assert test_block.strip() in ci_script  # CI runs the README test command verbatim
    install, launch = commands(install_block)
    assert install == "python3 -m pip install -e ."
    args = build_parser().parse_args(shlex.split(launch)[1:])
    assert shlex.split(launch)[0] == "workbench"
    assert args.demo
    assert args.command is None  # opens the GUI on the demo


def test_every_readme_command_has_a_runner():
    known = {
        CLI_HEADING: "test_cli_tour_runs_as_written",
        "## Desktop bundle": "test_bundle_build_command_parses",
        "## Desktop integration": "test_desktop_integration_commands_run",
    }
    after = AFTER_SETUP
    blocks_by_heading = {
        heading: fenced_blocks(section(heading), "bash")
        for heading in re.findall(r"\n(## .+)", after)
    }
    unrun = {h: b for h, b in blocks_by_heading.items() if b and h not in known}
    assert not unrun, f"README sections with shell commands no test runs: {sorted(unrun)}"


@pytest.mark.slow
def test_cli_tour_runs_as_written(user_dirs, capsys):
    (block,) = fenced_blocks(section(CLI_HEADING), "bash")
    lines = commands(block)
    assert len(lines) == 5
    for line in lines:
        argv = shlex.split(line)
        assert argv[0] == "workbench"
        assert main(argv[1:]) == 0, f"`{line}` failed:\n{capsys.readouterr().err}"
        out = capsys.readouterr().out
        assert out.strip(), f"`{line}` printed nothing"
    assert (user_dirs / "demo" / "config.json").is_file()
    assert load_device_map(user_dirs / "map.json")  # plan -o wrote a loadable map


def test_bundle_build_command_parses():
    (block,) = fenced_blocks(section("## Desktop bundle"), "bash")
    for line in commands(block):
        argv = shlex.split(line)
        assert argv[0] == "scripts/build-app"
        assert (ROOT / argv[0]).stat().st_mode & 0o111, "scripts/build-app is not executable"
        # The build itself runs in tests/test_packaging.py (WORKBENCH_TEST_BUNDLE=1);
        # here the flags must be ones the script accepts.
        result = subprocess.run(
            [sys.executable, str(ROOT / argv[0]), *argv[1:], "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        for flag in [*argv[1:], "--icons-only"]:  # --icons-only is named in the prose
            assert flag in result.stdout
    assert "scripts/build-app --icons-only" in section("## Desktop bundle")


def test_desktop_integration_commands_run(user_dirs, capsys):
    (block,) = fenced_blocks(section("## Desktop integration"), "bash")
    lines = commands(block)
    assert [shlex.split(line)[1:] for line in lines] == [
        ["install-desktop-entry"],
        ["install-desktop-entry", "--uninstall"],
    ]
    entry = user_dirs / "xdg_data_home" / "applications" / f"{APP_ID}.desktop"
    assert main(shlex.split(lines[0])[1:]) == 0
    assert entry.is_file()
    assert main(shlex.split(lines[1])[1:]) == 0
    assert not entry.exists()
    assert APP_ID in section("## Desktop integration")
    assert (ROOT / "docs" / "desktop-integration.md").is_file()


def test_device_map_examples_load_in_both_forms(tmp_path):
    plain, wrapped = fenced_blocks(section("## Device-map files"), "json")
    assert "format" not in json.loads(plain)
    assert json.loads(wrapped)["format"] == "workbench-device-map"
    for name, text in (("plain.json", plain), ("wrapped.json", wrapped)):
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        assert load_device_map(path)
    assert load_device_map(tmp_path / "plain.json")["model.layers.0"] == 0
    assert load_device_map(tmp_path / "wrapped.json")["lm_head"] == "disk"


def test_every_image_and_link_in_the_readme_exists():
    targets = re.findall(r"\]\(([^)\s]+)\)", README)
    local = [t for t in targets if not t.startswith(("http://", "https://", "#"))]
    assert any(t.startswith("docs/screenshots/") for t in local)
    missing = sorted(t for t in local if not (ROOT / t).exists())
    assert not missing, f"README links to missing files: {missing}"
