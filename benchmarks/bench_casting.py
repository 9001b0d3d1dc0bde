"""Layerwise casting: fp8 storage / bf16 compute against a plain bf16 forward (and accelerate).

Model: ``--layers`` x ``nn.Linear(--width, --width)`` (bias on), input ``(--batch, --width)``
bf16. The issue's target size is 12 x Linear(4096, 4096) = 12 * (4096*4096 + 4096) =
201,375,744 parameters (402.8 MB in bf16, 201.4 MB in fp8), run with ``--device cuda``. On CPU
fp8 -> bf16 casts are slow scalar loops, so the CPU default is a smaller stack.

Variants run side by side in this process, interleaved round by round:

- ``plain``        the model in bf16, no hooks (the floor);
- ``ours``         ``workbench.big_modeling.attach_layerwise_casting_hooks`` (fp8 storage,
                   ``fp8_kernel="auto"``); also ``ours_never`` (always ``Tensor.to``) and, on
                   CUDA with Triton, ``ours_always`` (always the Triton up-cast kernel);
- ``accel``        ``accelerate.big_modeling.attach_layerwise_casting_hooks`` when installed.

Prints the median forward time of each, the ratio to ``plain`` (target for ours: <= 3.5x),
resident weight bytes, CUDA forward peak memory, and checks ours and accelerate's outputs are
identical. ``--breakdown`` adds per-layer kernel times and host (Python + launch) time.

Measured on an H200 (torch 2.11, Triton 3.6), 12 x Linear(4096), ratio to plain bf16:

    batch     1: ours 3.32x  accelerate 4.36x      batch  128: ours 4.06x  accelerate 5.12x
    batch     8: ours 3.22x  accelerate 4.13x      batch 1024: ours 1.66x  accelerate 2.59x

At small batches the hooked forward is bound by host time (~40 us of Python and launches per
layer against ~18 us for a plain ``Linear``) and by PyTorch's fp8 cast kernel (53 us per
4096x4096 weight; our Triton kernel: 27 us).

On CPU (2 shared AMD EPYC cores, torch 2.13, ``--layers 12 --width 4096``) the up-cast, not
the matmul, dominates: PyTorch's fp8 cast is a scalar loop (~100 ms per 4096x4096 weight) plus
~25 ms of page faults for a fresh 32 MiB copy. Ours up-casts by a table look-up, two codes per
look-up, into a reused scratch buffer (``casting_kernels``, ``casting_scratch``): 11-14 ms per
weight, on one thread or two (the gather does not run in parallel). Ratio to plain bf16
(``ours_never``: ``Tensor.to`` into the scratch buffer), 2026-11-30:

    --threads 1   batch   1: ours 3.1-3.4x  ours_never 22x   accelerate 29-30x  (plain 51-54 ms)
                  batch   8: ours 1.45x     ours_never 4.8x  accelerate 5.6x    (334 ms)
    --threads 2   batch   1: ours 5.7x      ours_never 23x   accelerate 33x     (plain 30 ms)
                  batch   8: ours 1.8x      ours_never 4.8x  accelerate 6.7x    (172 ms)

With two threads the plain forward's matmuls run on both cores but the look-up does not, so at
batch 1 the ratio is worse than on one thread.

With 2 threads on 2 cores shared with other jobs every OpenMP region can wait for a descheduled
thread, so those figures swing 2x from run to run; ``--threads 1`` is steadier.

    python benchmarks/bench_casting.py                   # CPU, 4 x Linear(1024)
    python benchmarks/bench_casting.py --device cuda     # 12 x Linear(4096), the target
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from workbench.big_modeling import attach_layerwise_casting_hooks
from workbench.big_modeling.hooks.casting_kernels import (
    _fp8_upcast_kernel,
    fp8_upcast_triton,
    triton_failure,
)

STORAGE = torch.float8_e4m3fn
COMPUTE = torch.bfloat16


def build_stack(layers: int, width: int, device: str) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))
    return model.to(device=device, dtype=COMPUTE).eval()


def weight_nbytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def make_timer(device: str) -> Callable[[Callable[[], object]], float]:
    if device.startswith("cuda"):

        def time_cuda(fn: Callable[[], object]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3

        return time_cuda

    def time_cpu(fn: Callable[[], object]) -> float:
        start_s = time.perf_counter()
        fn()
        return time.perf_counter() - start_s

    return time_cpu


def peak_bytes(device: str, fn: Callable[[], object]) -> int | None:
    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def median_s(
    timer: Callable[[Callable[[], object]], float], fn: Callable[[], object], n: int
) -> float:
    """Median per-call time of ``fn``, timed in batches of 20 calls to hide event overhead."""
    fn()

    def twenty() -> None:
        for _ in range(20):
            fn()

    return statistics.median(timer(twenty) for _ in range(max(3, n // 10))) / 20


def host_s(device: str, fn: Callable[[], object], n: int) -> float:
    """Median host (Python + launch) time of ``fn``, the device drained before each call."""
    samples = []
    for _ in range(n):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start_s = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start_s)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return statistics.median(samples)


def print_breakdown(
    variants: dict[str, nn.Module], x: torch.Tensor, width: int, repeats: int
) -> None:
    """Per-layer kernel times and host time per forward: is the hooked forward host-bound?"""
    device = str(x.device)
    timer = make_timer(device)
    weight = torch.randn(width, width, device=device).to(STORAGE)
    bias = torch.randn(width, device=device).to(STORAGE)
    wide_weight, wide_bias = weight.to(COMPUTE), bias.to(COMPUTE)
    cast_s = median_s(timer, lambda: weight.to(COMPUTE), repeats)
    # a launch that fails (no C compiler for Triton's launcher...) returns None: then no figure
    has_kernel = (
        weight.is_cuda
        and _fp8_upcast_kernel() is not None
        and fp8_upcast_triton(weight, COMPUTE) is not None
    )
    if weight.is_cuda and triton_failure:
        print(f"the Triton up-cast kernel cannot run here: {triton_failure[0]}")
    kernel_s = (
        median_s(timer, lambda: fp8_upcast_triton(weight, COMPUTE), repeats)
        if has_kernel
        else float("nan")
    )
    bias_s = median_s(timer, lambda: bias.to(COMPUTE), repeats)
    linear_s = median_s(timer, lambda: nn.functional.linear(x, wide_weight, wide_bias), repeats)
    print(
        f"per layer: fp8->bf16 weight Tensor.to {cast_s * 1e6:.1f} us, our upcast {kernel_s * 1e6:.1f} us, "
        f"bias cast {bias_s * 1e6:.1f} us, "
        f"bf16 linear {linear_s * 1e6:.1f} us"
    )
    with torch.no_grad():
        for name, model in variants.items():
            launch_s = host_s(device, lambda m=model: m(x), repeats)
            print(f"{name:>12}: host time per forward {launch_s * 1e3:.3f} ms (Python + launches)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", type=int, default=None, help="default: 12 cuda, 4 cpu")
    parser.add_argument("--width", type=int, default=None, help="default: 4096 cuda, 1024 cpu")
    parser.add_argument("--batch", type=int, default=8, help="rows of the (batch, width) input")
    parser.add_argument("--repeats", type=int, default=None, help="default: 50 cuda, 5 cpu")
    parser.add_argument("--breakdown", action="store_true", help="per-layer kernel/host times")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    layers = args.layers or (12 if cuda else 4)
    width = args.width or (4096 if cuda else 1024)
    repeats = args.repeats or (50 if cuda else 5)

    plain = build_stack(layers, width, args.device)
    ours = copy.deepcopy(plain)
    attach_layerwise_casting_hooks(ours, STORAGE, COMPUTE)
    variants: dict[str, nn.Module] = {"plain": plain, "ours": ours}
    # the fixed policies beside "auto"; on CPU "always" is what "auto" does
    policies = ("never", "always") if cuda and _fp8_upcast_kernel() is not None else ("never",)
    for policy in policies:
        variant = copy.deepcopy(plain)
        attach_layerwise_casting_hooks(variant, STORAGE, COMPUTE, fp8_kernel=policy)
        variants[f"ours_{policy}"] = variant
    try:
        from accelerate.big_modeling import attach_layerwise_casting_hooks as accel_attach

        accel = copy.deepcopy(plain)
        accel_attach(accel, STORAGE, COMPUTE)
        variants["accel"] = accel
    except ImportError:
        print("accelerate not installed: skipping its variant")

    params = sum(p.numel() for p in plain.parameters())
    print(
        f"{layers} x Linear({width}, {width}) = {params:,} params; input ({args.batch}, {width}) "
        f"bf16; device {args.device}; {repeats} timed rounds; {torch.get_num_threads()} threads"
    )
    x = torch.randn(args.batch, width, device=args.device, dtype=COMPUTE)
    timer = make_timer(args.device)
    times: dict[str, list[float]] = {name: [] for name in variants}
    outputs: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, model in variants.items():  # warm-up (allocator, kernels)
            for _ in range(3 if cuda else 1):
                outputs[name] = model(x)
        peaks = {
            name: peak_bytes(args.device, lambda m=model: m(x)) for name, model in variants.items()
        }
        for _ in range(repeats):
            for name, model in variants.items():
                times[name].append(timer(lambda m=model: m(x)))

    base_s = statistics.median(times["plain"])
    for name, samples in times.items():
        median_s = statistics.median(samples)
        peak = peaks[name]
        peak_text = "" if peak is None else f"  forward peak {peak / 2**20:7.1f} MiB"
        print(
            f"{name:>12}: {median_s * 1e3:9.3f} ms  ratio {median_s / base_s:5.2f}x  "
            f"weights {weight_nbytes(variants[name]) / 2**20:7.1f} MiB{peak_text}"
        )
    if args.breakdown:
        print_breakdown(variants, x, width, repeats)
    if "accel" in outputs:
        same = torch.equal(outputs["ours"], outputs["accel"])
        print(f"ours == accelerate output: {same}")
        ratio = statistics.median(times["accel"]) / statistics.median(times["ours"])
        print(f"speed-up of ours over accelerate: {ratio:.2f}x")


if __name__ == "__main__":
    main()
