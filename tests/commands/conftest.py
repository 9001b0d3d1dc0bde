"""A small demo checkpoint shared by the command tests, and a helper that runs the CLI."""

from __future__ import annotations

import json
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


@pytest.fixture(scope="module")
def cpu_disk_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A small llama demo and a map file: layer 0 and the rest on the CPU, the other layers on
    disk."""
    root = tmp_path_factory.mktemp("run")
    folder = make_demo(root / "demo", arch="llama", params="2M", shards=2)
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu"}
    device_map |= {f"model.layers.{i}": "disk" for i in range(1, layers)}
    device_map |= {"model.norm": "cpu", "lm_head": "cpu"}
    map_file = root / "map.json"
    map_file.write_text(json.dumps(device_map))
    return folder, map_file
