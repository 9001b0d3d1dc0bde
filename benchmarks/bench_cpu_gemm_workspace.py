"""Resident memory a CPU matmul leaves behind, per dtype and weight shape (issue 21).

The first float32 ``linear`` of some shapes leaves MKL's packing buffers resident, per
thread, kept by MKL's own memory manager (``malloc_trim`` does not return them; setting
``MKL_DISABLE_FAST_MM=1`` before the process starts does). On CPUs with AVX-512 FP16 / AMX the
float16 and bfloat16 paths (oneDNN) leave their own buffers; elsewhere they leave almost
nothing. How much depends on the CPU, the threads and each call's shape and token count: on
one machine 4096x256 at 16 tokens left 4.07 MiB, on another 0.20 MiB at 13 tokens. So the
workbench does not model these buffers: it replays a run's matmuls once in a fresh process and
measures them (``workbench/runtime/gemm_workspace.py``), and adds them to the CPU's reserve.

Each case runs in a fresh process, so one case's buffers do not hide the next one's; it reads
the worker's own measures (``read_anonymous_bytes`` after ``release_free_heap``).

    python benchmarks/bench_cpu_gemm_workspace.py [--tokens 16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SHAPES = ((4096, 256), (8192, 512), (512, 8192), (50257, 128))
DTYPES = ("float32", "bfloat16", "float16")

_CASE = """
import json, sys, torch
from workbench.runtime.c_heap import release_free_heap
from workbench.runtime.memory_readings import read_anonymous_bytes
out_f, in_f, tokens, dtype = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
weight = torch.randn(out_f, in_f, dtype=getattr(torch, dtype))
x = torch.randn(1, tokens, in_f, dtype=weight.dtype)
release_free_heap()
before = read_anonymous_bytes()
torch.nn.functional.linear(x, weight)
release_free_heap()
print(json.dumps({"left": read_anonymous_bytes() - before, "weight": weight.nbytes}))
"""


def measure(shape: tuple[int, int], tokens: int, dtype: str, env: dict[str, str]) -> dict[str, int]:
    """Anonymous RSS one ``linear`` leaves resident after ``malloc_trim``, in a fresh process."""
    command = [sys.executable, "-c", _CASE, str(shape[0]), str(shape[1]), str(tokens), dtype]
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=16, help="rows of the input (prefill length)")
    args = parser.parse_args()
    settings = {
        "default": dict(os.environ),
        "1 thread": {**os.environ, "OMP_NUM_THREADS": "1"},
        "MKL_DISABLE_FAST_MM=1": {**os.environ, "MKL_DISABLE_FAST_MM": "1"},
    }
    print("| weight (out x in) | dtype | tokens | setting | weight MiB | left resident MiB |")
    print("|---|---|---|---|---|---|")
    for shape in SHAPES:
        for dtype in DTYPES:
            for tokens in (1, args.tokens):
                for name, env in settings.items():
                    if dtype != "float32" and name != "default":
                        continue
                    found = measure(shape, tokens, dtype, env)
                    print(
                        f"| {shape[0]} x {shape[1]} | {dtype} | {tokens} | {name} "
                        f"| {found['weight'] / 2**20:.2f} | {found['left'] / 2**20:.2f} |"
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
