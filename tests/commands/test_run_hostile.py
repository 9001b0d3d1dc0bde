"""``workbench run`` with hostile device maps: exit 2 and a message naming the problem.

Before the fixes a map for GPT-2 loaded on the Llama demo with exit 0, and ``{"": "cuda:99"}``
on a CPU-only machine failed with ``AssertionError: Torch not compiled with CUDA enabled``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from workbench.big_modeling.device_map.files import save_device_map
from workbench.cli import main


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from workbench.models import make_demo

    return make_demo(tmp_path_factory.mktemp("hostile") / "demo", arch="llama", params="1M")


def _run(demo: Path, map_file: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    argv = ["run", str(demo), "--device-map", str(map_file), "--max-new-tokens", "1"]
    code = main([*argv, "--in-process"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_map_recorded_for_another_model_is_refused(
    demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    map_file = tmp_path / "gpt2-map.json"
    save_device_map(
        map_file, {"": "cpu"}, **{"class": "GPT2LMHeadModel", "param_count": 124_439_808}
    )
    code, output = _run(demo, map_file, capsys)
    assert code == 2, output
    assert "made for another model" in output
    assert "class: the map was made for GPT2LMHeadModel, this model is LlamaForCausalLM" in output
    plain = tmp_path / "plain.json"  # the documented way out: the plain map inside
    plain.write_text(json.dumps(json.loads(map_file.read_text())["device_map"]))
    code, output = _run(demo, plain, capsys)
    assert code == 0, output


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
@pytest.mark.parametrize("device", ["cuda:99", "mps", "meta"])
def test_a_device_this_machine_lacks_is_named(
    demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], device: str
) -> None:
    map_file = tmp_path / "m.json"
    map_file.write_text(json.dumps({"": device}))
    code, output = _run(demo, map_file, capsys)
    assert code == 2, output
    assert "this machine does not have: '' -> " in output and "This machine has cpu" in output
    assert "AssertionError" not in output and "Traceback" not in output


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_hostile_tokenizer_file_falls_back_to_token_ids(
    demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    import shutil

    folder = shutil.copytree(demo, tmp_path / "demo")
    (folder / name).write_bytes(b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    map_file = tmp_path / "m.json"
    map_file.write_text(json.dumps({"": "cpu"}))
    code, output = _run(folder, map_file, capsys)
    assert code == 0, output  # the load and the inference run, on seeded token ids
