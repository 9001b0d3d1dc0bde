"""How long building the module tree takes, against the sizes pass a view would otherwise need.

Sizes:
- Llama 3.1 405B (bundled config, meta weights): 1,645 modules, 405.9 B parameters.
- The synthetic MoE of ``benchmarks/synthetic.py``: 48 layers x 512 experts, 98,453 modules
  (48 x 2,051 + 5).

For each model the script times, in one process, best of ``--repeat`` runs:
- ours: ``build_module_tree`` (names, classes, counts, bytes per dtype and as stored, tied and
  no-split flags, children);
- ``compute_module_sizes`` of our engine (bytes only, no tree);
- ``accelerate.utils.compute_module_sizes`` when accelerate is installed (bytes only);
- a naive tree: one node per module with ``sum(p.numel() for p in module.parameters())``
  (what a straightforward view model does; quadratic in depth).
It prints times and ratios (baseline / ours; above 1 means ours is faster), and PASS or FAIL
for ours against its target: the 405B tree under 1 s, the MoE tree under 3 s.

    python benchmarks/bench_tree.py [--repeat 3] [--skip-naive] [--only llama|moe]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synthetic import build_moe

from workbench.big_modeling.planning.sizes import compute_module_sizes
from workbench.models.catalog import bundled_config_path
from workbench.models.intake import build_config, build_empty_model, read_config
from workbench.models.tree import build_module_tree


def best_of(repeat: int, func: Callable[[], object]) -> float:
    """Best wall time of ``repeat`` runs (CPU time is printed by ``bench`` for loaded machines)."""
    times = []
    for _ in range(repeat):
        start_s = time.perf_counter()
        func()
        times.append(time.perf_counter() - start_s)
    return min(times)


def cpu_time(func: Callable[[], object]) -> float:
    start_s = time.process_time()
    func()
    return time.process_time() - start_s


def naive_tree(model: torch.nn.Module) -> dict[str, tuple[str, int, int]]:
    nodes = {}
    for name, module in model.named_modules():
        params = list(module.parameters())
        nodes[name] = (
            type(module).__name__,
            sum(p.numel() for p in params),
            sum(p.numel() * p.element_size() for p in params),
        )
    return nodes


LLAMA_TARGET_S = 1.0
MOE_TARGET_S = 3.0


def bench(
    label: str,
    model: torch.nn.Module,
    no_split: list[str],
    args: argparse.Namespace,
    target_s: float,
) -> bool:
    """Time the tree of ``model`` against the baselines; return whether ours met ``target_s``."""
    tree = build_module_tree(model, dtype=torch.float16, no_split_classes=no_split)
    print(f"\n{label}: {len(tree):,} modules, {tree.root.param_count / 1e9:.2f} B params")
    ours_s = best_of(
        args.repeat,
        lambda: build_module_tree(model, dtype=torch.float16, no_split_classes=no_split),
    )
    ours_cpu_s = cpu_time(
        lambda: build_module_tree(model, dtype=torch.float16, no_split_classes=no_split)
    )
    passed = ours_s < target_s
    print(
        f"  ours: {ours_s * 1000:.1f} ms wall (best of {args.repeat}), {ours_cpu_s * 1000:.1f} ms CPU"
        f"  -> {'PASS' if passed else 'FAIL'} (target < {target_s:g} s)"
    )
    rows = [("ours: build_module_tree", ours_s)]
    rows.append(
        (
            "engine compute_module_sizes",
            best_of(args.repeat, lambda: compute_module_sizes(model, dtype=torch.float16)),
        )
    )
    try:
        from accelerate.utils import compute_module_sizes as accelerate_sizes
    except ImportError:
        print("  (accelerate not installed: skipping its compute_module_sizes)")
    else:
        rows.append(
            (
                "accelerate compute_module_sizes",
                best_of(args.repeat, lambda: accelerate_sizes(model, dtype=torch.float16)),
            )
        )
    if not args.skip_naive:
        rows.append(("naive per-module parameters() tree", best_of(1, lambda: naive_tree(model))))
    for name, seconds in rows:
        ratio = seconds / ours_s
        print(f"  {name:<38} {seconds * 1000:9.1f} ms   ratio {ratio:6.2f}x")
    return passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument("--only", choices=("llama", "moe"), help="run one of the two models")
    args = parser.parse_args()

    results: dict[str, bool] = {}
    if args.only != "moe":
        results["Llama 3.1 405B"] = bench_llama(args)
    if args.only != "llama":
        start_s = time.perf_counter()
        moe = build_moe()
        print(f"\nbuilt synthetic MoE in {time.perf_counter() - start_s:.2f} s")
        results["synthetic MoE"] = bench(
            "synthetic MoE 48x512", moe, ["MoELayer"], args, MOE_TARGET_S
        )
    print()
    for label, passed in results.items():
        print(f"{'PASS' if passed else 'FAIL'}  {label} tree")
    return 0 if all(results.values()) else 1


def bench_llama(args: argparse.Namespace) -> bool:
    config_path = bundled_config_path("llama-3.1-405b")
    config = build_config(read_config(config_path), config_path)
    start_s = time.perf_counter()
    llama, _ = build_empty_model(config, config_path)
    print(f"built empty Llama 3.1 405B with transformers in {time.perf_counter() - start_s:.2f} s")
    return bench(
        "Llama 3.1 405B (meta)", llama, sorted(llama._no_split_modules), args, LLAMA_TARGET_S
    )


if __name__ == "__main__":
    raise SystemExit(main())
