"""Run one benchmark from two revisions of this repository side by side, round after round.

The renovation (and any refactor) must not slow anything down. This script checks out a
baseline revision into a temporary git worktree, then runs the same benchmark script from the
baseline tree and from the working tree alternately (``--rounds`` times each, the baseline
first in odd rounds and second in even ones, so neither side always runs on a warmer machine),
each in a fresh process with ``PYTHONPATH`` set to its own tree. It prints every run's output
under a header, then the lines both sides print that carry the figures you name with
``--grep`` (a regular expression), baseline above working tree, so the two can be read as a
ratio in the same run. ``--base-patch`` applies a patch to the baseline tree first, for a fix
to the benchmark script itself that the baseline revision lacks.

    python benchmarks/compare_revisions.py --base HEAD~3 --grep "per hook|ours" -- \
        benchmarks/bench_hooks.py --layers 1000 --repeats 30

Sizes are the benchmark's own (stated in its docstring).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(tree: Path, script_and_args: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=str(tree))
    result = subprocess.run(
        [sys.executable, *script_and_args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    return result.stdout + result.stderr + f"[exit status {result.returncode}]\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="baseline revision (commit, tag, HEAD~N)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--grep", default=".", help="regex selecting the figure lines to pair")
    parser.add_argument(
        "--base-patch",
        type=Path,
        help="a patch applied to the baseline tree first (e.g. a fix to the benchmark itself)",
    )
    parser.add_argument("script_and_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    script_and_args = [a for a in args.script_and_args if a != "--"]
    if not script_and_args:
        parser.error("name the benchmark script after --")
    pattern = re.compile(args.grep)
    with tempfile.TemporaryDirectory(prefix="workbench-base-") as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base_tree), args.base],
            check=True,
            capture_output=True,
        )
        if args.base_patch is not None:
            subprocess.run(
                ["git", "-C", str(base_tree), "apply", str(args.base_patch.resolve())],
                check=True,
            )
        try:
            outputs: dict[str, list[str]] = {"baseline": [], "working tree": []}
            for round_number in range(args.rounds):
                order = [("baseline", base_tree), ("working tree", ROOT)]
                if round_number % 2:
                    order.reverse()
                for label, tree in order:
                    text = _run(tree, script_and_args)
                    outputs[label].append(text)
                    print(f"===== round {round_number + 1}, {label} ({tree})\n{text}", flush=True)
            print(f"===== figures ({args.grep!r}), baseline {args.base} vs working tree")
            for round_number in range(args.rounds):
                for label in outputs:
                    lines = [
                        line
                        for line in outputs[label][round_number].splitlines()
                        if pattern.search(line)
                    ]
                    print(f"-- round {round_number + 1}, {label}:")
                    print("\n".join(f"   {line}" for line in lines))
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)],
                check=False,
                capture_output=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
