"""``init_empty_weights`` against torch's own meta device: building a huge model empty.

Sizes: ``--layers`` x ``nn.Linear(--width, --width)`` (default 1000 x 10000 x 10000 = 1e11
parameters, 400 GB in float32), built under ``init_empty_weights()`` (ours) and under
``torch.device("meta")`` (the baseline), alternating, ``--repeats`` rounds; medians.

Target: ours < 3 x meta + 0.5 s (the same order of cost: the parameters are registered on meta,
never allocated). The RSS growth of ours is printed too (the test suite asserts it stays under
100 MiB).

Usage: python benchmarks/bench_empty_init.py [--layers 1000] [--width 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import psutil
import torch
from torch import nn

from workbench.big_modeling.empty_init import init_empty_weights

TARGET_FACTOR = 3.0
TARGET_SLACK_S = 0.5


def build_s(context: Callable[[], AbstractContextManager], layers: int, width: int) -> float:
    start_s = time.perf_counter()
    with context():
        model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    elapsed = time.perf_counter() - start_s
    if not all(p.is_meta for p in model.parameters()):
        raise RuntimeError("a parameter was allocated")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=1000)
    parser.add_argument("--width", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    params = args.layers * (args.width * args.width + args.width)
    print(f"{args.layers} x Linear({args.width}, {args.width}): {params:.3g} parameters")

    rss_before = psutil.Process().memory_info().rss
    build_s(init_empty_weights, args.layers, args.width)  # warm up (and the RSS figure)
    rss_growth = psutil.Process().memory_info().rss - rss_before
    ours, meta = [], []
    for _ in range(args.repeats):
        ours.append(build_s(init_empty_weights, args.layers, args.width))
        meta.append(build_s(lambda: torch.device("meta"), args.layers, args.width))
    ours_s, meta_s = statistics.median(ours), statistics.median(meta)
    limit_s = TARGET_FACTOR * meta_s + TARGET_SLACK_S
    print(f"init_empty_weights   {ours_s:7.3f} s  (rss +{rss_growth / 2**20:.0f} MiB)")
    print(f"torch.device('meta') {meta_s:7.3f} s  ratio {ours_s / meta_s:.2f}x")
    print(
        f"target ours < {TARGET_FACTOR:.0f} x meta + {TARGET_SLACK_S} s = {limit_s:.3f} s: "
        f"{'met' if ours_s < limit_s else 'NOT MET'}"
    )


if __name__ == "__main__":
    main()
