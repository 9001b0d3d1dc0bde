"""``workbench run``: the CLI over the same jobs, in process and through the worker."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.cli import main


@pytest.fixture(scope="module")
def demo(cpu_disk_demo: tuple[Path, Path]) -> tuple[Path, Path]:
    """The shared cpu + disk demo (``conftest.cpu_disk_demo``)."""
    return cpu_disk_demo


def test_run_in_process_json_with_verify(
    demo: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    folder, map_file = demo
    code = main(
        [
            "run",
            str(folder),
            "--device-map",
            str(map_file),
            "--prompt",
            "The planner",
            "--max-new-tokens",
            "3",
            "--dtype",
            "float32",
            "--verify",
            "--json",
            "--in-process",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(out)
    assert report["load"]["model_class"] == "LlamaForCausalLM"
    assert report["inference"]["new_tokens"] == 3
    assert report["inference"]["tokens_per_s"] > 0
    disk = [row for row in report["inference"]["per_layer"] if row["source"] == "disk"]
    assert disk and all(row["nbytes"] > 0 for row in disk)
    assert report["verify"]["passed"] and report["verify"]["exact"]


def test_run_rejects_a_map_that_names_unknown_modules(
    demo: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, _ = demo
    bad_map = tmp_path / "bad.json"
    bad_map.write_text(json.dumps({"": "cpu", "model.layers.99": "disk"}))
    code = main(["run", str(folder), "--device-map", str(bad_map), "--in-process"])
    assert code == 2
    assert "model.layers.99" in capsys.readouterr().err
    missing = main(["run", str(folder), "--device-map", str(tmp_path / "nope.json")])
    assert missing == 2


@pytest.mark.slow
def test_run_through_the_worker_prints_text_speed_and_transfers(
    demo: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    folder, map_file = demo
    code = main(
        [
            "run",
            str(folder),
            "--device-map",
            str(map_file),
            "--prompt",
            "Once upon a time",
            "--max-new-tokens",
            "4",
            "--dtype",
            "float32",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "tokens/s, time to first token" in out
    assert "weight transfers in the last forward (per device-map entry):" in out
    assert "model.layers.1" in out and "disk -> cpu" in out
    assert multiprocessing.active_children() == []  # the worker was shut down and joined


def _run_human(folder: Path, map_file: Path, *extra: str) -> int:
    return main(
        [
            "run",
            str(folder),
            "--device-map",
            str(map_file),
            "--max-new-tokens",
            "2",
            "--dtype",
            "float32",
            *extra,
        ]
    )


def test_run_human_output_prints_the_verify_line_and_progress_on_stderr(
    demo: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    folder, map_file = demo
    code = _run_human(folder, map_file, "--prompt", "The planner", "--verify", "--in-process")
    captured = capsys.readouterr()
    assert code == 0, captured
    assert "verify: identical to cpu (transformers from_pretrained, no dispatch)" in captured.out
    assert "max abs diff 0" in captured.out
    # the progress bar (tqdm) goes to stderr, with each phase of the load; stdout stays clean
    for phase in ("building", "loading", "dispatching"):
        assert phase in captured.err, captured.err
    assert "building" not in captured.out and "\r" not in captured.out


def test_run_exits_1_when_verify_finds_a_difference(
    demo: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import load_file, save_file

    source, map_file = demo
    folder = Path(shutil.copytree(source, tmp_path / "corrupt"))
    shard = next(
        p for p in sorted(folder.glob("*.safetensors")) if "model.norm.weight" in load_file(str(p))
    )
    tensors = load_file(str(shard))
    tensors["model.norm.weight"][0] = float("nan")  # a corrupt weight: every logit turns NaN
    save_file(tensors, str(shard), metadata={"format": "pt"})
    code = _run_human(folder, map_file, "--verify", "--in-process")
    out = capsys.readouterr().out
    assert code == 1, out
    assert "verify: DIFFERENT (non-finite outputs) to cpu" in out


@pytest.mark.slow
def test_run_warns_when_the_prompt_is_ignored_for_lack_of_a_tokenizer(
    demo: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, map_file = demo
    folder = Path(shutil.copytree(source, tmp_path / "no-tokenizer"))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    code = _run_human(folder, map_file, "--prompt", "Once upon a time")  # through the worker
    captured = capsys.readouterr()
    assert code == 0, captured
    assert "worker: " in captured.err and "the prompt is ignored" in captured.err, captured.err
    assert "has no tokenizer" in captured.err
    assert "2 tokens from an 8-token prompt" in captured.out  # the seeded synthetic ids


@pytest.fixture(scope="module")
def chat_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from chat_demo import make_chat_demo

    return make_chat_demo(tmp_path_factory.mktemp("run-chat") / "demo")


def test_one_chat_turn_with_sampling_options_as_json(
    chat_demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", str(chat_demo), "--system", "Be brief.", "--prompt", "What is a plan?"]
    argv += ["--max-new-tokens", "4", "--temperature", "0.8", "--top-p", "0.9", "--top-k", "20"]
    argv += ["--seed", "5", "--repetition-penalty", "1.1", "--json", "--in-process"]
    code = main(argv)  # no --device-map: the whole model on the CPU
    out = capsys.readouterr().out
    assert code == 0, out
    inference = json.loads(out)["inference"]
    assert inference["chat_template"] is True
    assert inference["prompt_text"] == (
        "<s>system\nBe brief.</s>\n<s>user\nWhat is a plan?</s>\n<s>assistant\n"
    )
    assert inference["sampling"] == {
        "greedy": False,
        "temperature": 0.8,
        "top_p": 0.9,
        "top_k": 20,
        "seed": 5,
        "repetition_penalty": 1.1,
    }
    assert inference["predicted_for"] == "detected" and inference["predicted"]["tokens_per_s"] > 0
    assert main(argv) == 0  # the same seed: the same answer
    assert json.loads(capsys.readouterr().out)["inference"]["token_ids"] == inference["token_ids"]


def test_sampling_options_without_a_temperature_are_refused(
    chat_demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(chat_demo), "--top-k", "5", "--seed", "1", "--in-process"]) == 2
    err = capsys.readouterr().err
    assert "--top-k, --seed only act when sampling; add --temperature" in err
    assert main(["run", str(chat_demo), "--temperature", "0.5", "--top-p", "2"]) == 2
    assert "top_p must be in (0, 1], got 2.0" in capsys.readouterr().err


@pytest.mark.slow
def test_an_interactive_chat_in_the_terminal(chat_demo: Path) -> None:
    """Lines typed on stdin of a real process: two turns, a new chat, an empty line ends."""
    command = [sys.executable, "-m", "workbench", "run", str(chat_demo), "--chat", "--in-process"]
    command += ["--system", "Be brief.", "--max-new-tokens", "3", "--verify"]
    typed = "Hello\nAnd then?\n/new\nHi\n\n"
    done = subprocess.run(command, input=typed, capture_output=True, text=True, check=False)
    output = done.stdout
    assert done.returncode == 0, done.stderr
    assert output.count("you> ") == 5 and output.count("model> ") == 3, output
    assert "(a new chat)" in output and output.count("tokens/s, time to first token") == 3
    assert "verify: greedy continuation identical: 16 of 16 tokens match" in output


def test_an_encoder_run_reports_one_forward_not_tokens_per_second(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench.models.demo import make_demo

    folder = make_demo(tmp_path_factory.mktemp("bert") / "demo", arch="bert", params="2M")
    argv = ["run", str(folder), "--prompt", "Memory decides", "--max-new-tokens", "4"]
    assert main([*argv, "--in-process"]) == 0
    out = capsys.readouterr().out
    figures = out[out.index("one forward over") :].splitlines()
    # "one forward over 5 tokens (no generation): 3.1 ms" then the prediction for the same
    assert figures[0].endswith(" ms") and "(no generation)" in figures[0]
    assert figures[1].startswith("predicted for this machine: ") and figures[1].endswith(" ms")
    assert "tokens/s" not in out and "time to first token" not in out and "sampling:" not in out
    assert main([*argv, "--in-process", "--json"]) == 0
    inference = json.loads(capsys.readouterr().out)["inference"]
    assert inference["new_tokens"] == 0 and inference["stop_reason"] == "forward"
    assert 0 < inference["predicted"]["forward_s"] == inference["predicted"]["ttft_s"]
