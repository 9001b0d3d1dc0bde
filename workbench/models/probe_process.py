"""Run a measurement in a fresh process of this interpreter, so that nothing the caller runs
(a loaded model, a telemetry thread holding the GIL, the caller's matmul buffers) is in it.

A probe module answers ``python -m MODULE`` with a JSON spec on stdin by printing one JSON
object as its last line (``probe_main`` does both sides' plumbing).

Example:
    >>> run_probe_process("workbench.models.matmul_probe", {"threads": 2})  # doctest: +SKIP
    {'points': {...}, 'threads': 2, 'measured_at': ...}
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["measure_apart", "probe_main", "run_probe_process"]

Probe = TypeVar("Probe")


def run_probe_process(
    module: str, spec: dict[str, Any], *, timeout_s: float = 300.0, what: str = "the probe"
) -> dict[str, Any]:
    """``python -m module`` with ``spec`` as JSON on stdin; its last stdout line, parsed.

    Raises:
        RuntimeError: the process could not start, ran past ``timeout_s``, failed, or printed
            no JSON object (its stderr's tail in the message).
    """
    try:
        done = subprocess.run(
            [sys.executable, "-m", module],
            input=json.dumps(spec),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{what} did not finish: {exc}") from exc
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {done.stderr[-800:]}")
    return answer


def measure_apart(module: str, probe_type: Callable[..., Probe], what: str) -> Probe:
    """The probe ``module`` run in a fresh process at this process's torch thread count,
    its answer as ``probe_type``.

    Raises:
        RuntimeError: the probe process failed.
    """
    answer = run_probe_process(module, {"threads": torch.get_num_threads()}, what=what)
    return probe_type(**answer)


def probe_main(measure: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """The probe process's side: read the spec, set its ``threads`` (the caller's torch thread
    count), start the thread pool, print ``measure(spec)`` as one JSON line."""
    spec = json.loads(sys.stdin.read() or "{}")
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    torch.randn(2**20).add_(1.0)  # the thread pool starts before anything is measured
    print(json.dumps(measure(spec)))
    return 0
