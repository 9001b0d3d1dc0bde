"""A small demo checkpoint shared by the command tests, and a helper that runs the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.cli import main
from workbench.models.demo import make_demo


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~2M-parameter Llama demo in float16, two shards."""
    return make_demo(tmp_path_factory.mktemp("cli") / "demo", arch="llama", params="2M", shards=2)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run ``workbench ARGS`` in process; return ``(exit_code, stdout, stderr)``."""

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run
