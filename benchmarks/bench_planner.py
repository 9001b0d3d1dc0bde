"""Planner and empty-init speed: ours against Accelerate, side by side in one process.

Sizes:
- Llama 70B config (80 layers, hidden 8192, intermediate 28672, 64 heads, 8 KV heads, vocab
  128256) and Llama 405B (126 layers, hidden 16384, intermediate 53248, 128 heads, 8 KV heads),
  bfloat16, budgets {0: 24GiB, 1: 24GiB, cpu: 64GiB} (the rest goes to disk);
- the synthetic MoE of benchmarks/synthetic.py (48 layers x 512 experts x 3 Linear, ~98k
  modules), budgets 1/3, 1/3 of the model on two GPUs and 1/5 on CPU;
- each with ``no_split_module_classes`` set (decoder layer / MoE layer) and unset;
- empty init of nn.Sequential of 1000 x Linear(10000, 10000) (1e11 parameters) against
  ``with torch.device("meta")`` and Accelerate's ``init_empty_weights``.

Planning is pure (no GPU needed); times are the best of ``--repeat`` rounds, ours and
Accelerate alternating which goes first. No planner state is cached between calls: every
round is a cold plan.

    python benchmarks/bench_planner.py [--repeat 3] [--moe-layers 48] [--skip-moe]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synthetic import build_moe

from workbench.big_modeling.empty_init import init_empty_weights
from workbench.big_modeling.planning.planner import infer_auto_device_map
from workbench.big_modeling.planning.sizes import compute_module_sizes, format_nbytes

try:
    from accelerate import init_empty_weights as accelerate_init_empty_weights
    from accelerate.utils import infer_auto_device_map as accelerate_infer
except ImportError:  # the benchmark still runs ours alone
    accelerate_infer = None
    accelerate_init_empty_weights = None


def best_of(repeat: int, run: Callable[[], object]) -> tuple[float, object]:
    best_s, result = float("inf"), None
    for _ in range(repeat):
        start_s = time.perf_counter()
        result = run()
        best_s = min(best_s, time.perf_counter() - start_s)
    return best_s, result


def llama(layers: int, hidden: int, intermediate: int, heads: int) -> nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=128256,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    )
    with init_empty_weights():
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def compare(
    label: str, model: nn.Module, budgets: dict, no_split: list[str] | None, repeat: int
) -> None:
    """Best of ``repeat`` for ours and Accelerate, alternating which runs first each round."""
    runs: dict[str, Callable[[], dict]] = {
        "ours": lambda: infer_auto_device_map(
            model, dict(budgets), no_split_module_classes=no_split
        )
    }
    if accelerate_infer is not None:
        runs["accelerate"] = lambda: dict(
            accelerate_infer(model, dict(budgets), no_split_module_classes=no_split)
        )
    best_s = dict.fromkeys(runs, float("inf"))
    maps: dict[str, dict] = {}
    for round_number in range(repeat):
        order = list(runs) if round_number % 2 == 0 else list(reversed(runs))
        for name in order:
            elapsed_s, maps[name] = best_of(1, runs[name])
            best_s[name] = min(best_s[name], elapsed_s)
    ours_s = best_s["ours"]
    line = f"{label:<34} ours {ours_s * 1000:9.1f} ms ({len(maps['ours']):5d} keys)"
    if "accelerate" in runs:
        theirs_s = best_s["accelerate"]
        same = "same map" if maps["accelerate"] == maps["ours"] else "maps differ"
        line += (
            f" | accelerate {theirs_s * 1000:9.1f} ms | x{theirs_s / ours_s:5.1f} faster, {same}"
        )
    print(line, flush=True)


def bench_empty_init(repeat: int) -> None:
    def stack() -> nn.Module:
        return nn.Sequential(*[nn.Linear(10000, 10000) for _ in range(1000)])

    def under(context: Callable[[], object]) -> Callable[[], nn.Module]:
        def build() -> nn.Module:
            with context():
                return stack()

        return build

    meta_s, _ = best_of(repeat, under(lambda: torch.device("meta")))
    ours_s, model = best_of(repeat, under(init_empty_weights))
    assert all(p.is_meta for p in model.parameters())
    line = (
        f"{'empty init, 1e11 params (1000 x 1e8)':<34} ours {ours_s * 1000:9.1f} ms"
        f" | torch.device('meta') {meta_s * 1000:9.1f} ms | ratio meta/ours {meta_s / ours_s:4.2f}"
    )
    if accelerate_init_empty_weights is not None:
        theirs_s, _ = best_of(repeat, under(accelerate_init_empty_weights))
        line += f" | accelerate {theirs_s * 1000:9.1f} ms (x{theirs_s / ours_s:4.2f})"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--moe-layers", type=int, default=48)
    parser.add_argument("--skip-moe", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # Accelerate warns that GPUs 0 and 1 do not exist here
    warnings.simplefilter("ignore")
    what_if = {0: "24GiB", 1: "24GiB", "cpu": "64GiB"}

    print(f"torch {torch.__version__}; accelerate {'present' if accelerate_infer else 'absent'}")
    bench_empty_init(args.repeat)
    for name, shape in {
        "Llama 70B": (80, 8192, 28672, 64),
        "Llama 405B": (126, 16384, 53248, 128),
    }.items():
        model = llama(*shape)
        total = compute_module_sizes(model)[""]
        count = sum(1 for _ in model.modules())
        print(f"{name}: {format_nbytes(total)} bf16, {count:,} modules, budgets {what_if}")
        compare(
            f"  {name}, no_split=LlamaDecoderLayer",
            model,
            what_if,
            ["LlamaDecoderLayer"],
            args.repeat,
        )
        compare(f"  {name}, no_split unset", model, what_if, None, args.repeat)
        del model
    if args.skip_moe:
        return
    start_s = time.perf_counter()
    model = build_moe(num_layers=args.moe_layers)
    build_s = time.perf_counter() - start_s
    total = compute_module_sizes(model)[""]
    count = sum(1 for _ in model.modules())
    budgets = {0: total // 3, 1: total // 3, "cpu": total // 5}
    print(
        f"MoE {args.moe_layers}x512x3: {count:,} modules, {format_nbytes(total)}, built in {build_s:.1f} s"
    )
    compare("  MoE, no_split=MoELayer", model, budgets, ["MoELayer"], args.repeat)
    compare("  MoE, no_split unset", model, budgets, None, args.repeat)
    compare("  MoE, everything fits one GPU", model, {0: total, "cpu": total}, None, args.repeat)


if __name__ == "__main__":
    main()
