"""Hook overhead: ours against accelerate, side by side in one process.

Model: 1000 x (Linear(64, 64) + ReLU) in one nn.Sequential (1000 hooked Linear modules),
batch 8, float32, inference (no_grad). For each configuration we time the hooked forward and
the plain forward of an identical model and report

    per-hook overhead = (hooked forward - plain forward) / 1000   [microseconds]

Configurations: ``dispatch_model(model, {"": device}, force_hooks=True)`` (execution-device
hooks, target <= 2 us; accelerate ~8 us) and ``cpu_offload(model, execution_device=device)``
(offloading hooks, target <= 20 us with device "cpu"; accelerate ~88 us).

The "floor" row wraps every Linear's forward in the thinnest Python wrapper there is (a closure
calling the original forward): no hook can cost less, so ``ours - floor`` is what the hook
logic itself costs. On a busy machine the figures move by about 1 us/hook between runs; every
model is timed once per round, round after round, and the fastest forward of each is kept.

    python benchmarks/bench_hooks.py [--device cpu|cuda] [--layers 1000] [--repeats 30]
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def build(layers: int) -> nn.Sequential:
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(64, 64), nn.ReLU()]
    return nn.Sequential(*blocks).eval()


def _thin_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    def forward(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    return forward


def thin_wrapped(model: nn.Sequential) -> nn.Sequential:
    """``model`` with each Linear's forward behind a closure that only calls the original."""
    for module in model:
        if isinstance(module, nn.Linear):
            module.forward = _thin_wrapper(module.forward)
    return model


def fastest_forwards(
    models: dict[str, nn.Module], x: torch.Tensor, repeats: int, device: torch.device
) -> dict[str, float]:
    """Fastest of ``repeats`` forwards of each model, in seconds, the models taking turns.

    On CPU the clock is the thread's CPU time (torch runs single-threaded here), which a busy
    shared machine cannot inflate by descheduling us; on CUDA it is wall time after a sync.
    """
    cuda = device.type == "cuda"
    clock = time.perf_counter if cuda else time.thread_time
    best = dict.fromkeys(models, float("inf"))
    with torch.no_grad():
        for model in models.values():  # warm-up
            model(x)
            model(x)
        for _ in range(repeats):
            for name, model in models.items():
                if cuda:
                    torch.cuda.synchronize(device)
                start = clock()
                model(x)
                if cuda:
                    torch.cuda.synchronize(device)
                best[name] = min(best[name], clock() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(1)  # 64x64 matmuls gain nothing from threads; keeps CPU time exact
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)

    from workbench.big_modeling import dispatch as ours

    try:
        import accelerate
        from accelerate import big_modeling as theirs
    except ImportError:  # accelerate is optional: benchmarks only
        theirs = None

    base = build(args.layers)
    x = torch.randn(8, 64, device=device)
    plain = copy.deepcopy(base).to(device)
    floor = thin_wrapped(copy.deepcopy(base).to(device))
    print(
        f"model: {args.layers} x (Linear(64,64)+ReLU), batch 8, fp32, device {device}, "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}"
        + (f", accelerate {accelerate.__version__}" if theirs else ", accelerate not installed")
    )

    configs = {
        "dispatch_model(force_hooks=True)": lambda lib, m: lib.dispatch_model(
            m, {"": device.index if device.type == "cuda" else "cpu"}, force_hooks=True
        ),
        "cpu_offload(execution_device)": lambda lib, m: lib.cpu_offload(m, execution_device=device),
    }
    for name, apply in configs.items():
        models = {"plain": plain, "floor": floor, "ours": apply(ours, copy.deepcopy(base))}
        if theirs:
            models["accelerate"] = apply(theirs, copy.deepcopy(base))
        with torch.no_grad():
            torch.testing.assert_close(models["ours"](x), plain(x), rtol=0, atol=0)
        best = fastest_forwards(models, x, args.repeats, device)
        per_hook = {key: (best[key] - best["plain"]) / args.layers * 1e6 for key in best}
        line = (
            f"{name:33s} plain {best['plain'] * 1e3:6.2f} ms | floor {per_hook['floor']:5.2f}"
            f" | ours {per_hook['ours']:5.2f} us/hook"
            f" (floor + {per_hook['ours'] - per_hook['floor']:5.2f})"
        )
        if "accelerate" in per_hook:
            their_us = per_hook["accelerate"]
            line += (
                f" | accelerate {their_us:6.2f} us/hook"
                f" | accelerate/ours {their_us / max(per_hook['ours'], 1e-3):5.1f}x"
            )
        print(line)


if __name__ == "__main__":
    main()
