"""Hook overhead: ours against accelerate, side by side in one process.

Model: 1000 x (Linear(64, 64) + ReLU) in one nn.Sequential (1000 hooked Linear modules),
batch 8, float32, inference (no_grad). For each configuration we time the hooked forward and
the plain forward of an identical model and report

    per-hook overhead = (hooked forward - plain forward) / 1000   [microseconds]

Configurations: ``dispatch_model(model, {"": device}, force_hooks=True)`` (execution-device
hooks, target <= 2 us; accelerate ~8 us) and ``cpu_offload(model, execution_device=device)``
(offloading hooks, target <= 20 us with device "cpu"; accelerate ~88 us).

    python benchmarks/bench_hooks.py [--device cpu|cuda] [--layers 1000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from torch import nn


def build(layers: int) -> nn.Sequential:
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(64, 64), nn.ReLU()]
    return nn.Sequential(*blocks).eval()


def time_forward(model: nn.Module, x: torch.Tensor, repeats: int, device: torch.device) -> float:
    """Fastest of ``repeats`` forwards, in seconds (after two warm-up calls).

    On CPU the clock is the thread's CPU time (torch runs single-threaded here), which a busy
    shared machine cannot inflate by descheduling us; on CUDA it is wall time after a sync.
    """
    clock = time.perf_counter if device.type == "cuda" else time.thread_time
    samples = []
    with torch.no_grad():
        for i in range(repeats + 2):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = clock()
            model(x)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= 2:
                samples.append(clock() - start)
    return min(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=10)
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
        ours_model = apply(ours, copy.deepcopy(base))
        their_model = apply(theirs, copy.deepcopy(base)) if theirs else None
        with torch.no_grad():
            torch.testing.assert_close(ours_model(x), plain(x), rtol=0, atol=0)
        # interleave rounds so machine noise hits all three alike
        t_plain, t_ours, t_theirs = [], [], []
        for _ in range(3):
            t_plain.append(time_forward(plain, x, args.repeats, device))
            t_ours.append(time_forward(ours_model, x, args.repeats, device))
            if their_model is not None:
                t_theirs.append(time_forward(their_model, x, args.repeats, device))
        plain_s = min(t_plain)
        ours_us = (min(t_ours) - plain_s) / args.layers * 1e6
        line = (
            f"{name:36s} plain {plain_s * 1e3:7.2f} ms | ours {min(t_ours) * 1e3:7.2f} ms "
            f"= {ours_us:6.2f} us/hook"
        )
        if t_theirs:
            their_us = (min(t_theirs) - plain_s) / args.layers * 1e6
            line += (
                f" | accelerate {min(t_theirs) * 1e3:7.2f} ms = {their_us:6.2f} us/hook"
                f" | accelerate/ours overhead ratio {their_us / max(ours_us, 1e-3):5.1f}x"
            )
        print(line)


if __name__ == "__main__":
    main()
