"""Joint precision + placement planner: time against the plain planner, and what it picks.

Sizes:
- Llama 3.1 405B (bundled config, 126 layers, bfloat16) with 3 precisions (int4-g128, int8,
  bfloat16) x 3 devices (GPU 0 80 GiB, CPU 256 GiB, disk 2 TiB; the rtx4090-64gb profile's
  speeds), ``--min-bits 4.5``: ``plan_opened_precisions`` against ``infer_auto_device_map``
  (``plan_opened_model``) on the same opened model in the same run, best of ``--repeat``, and
  against itself walking the model per candidate (the search before it reused one index);
- Llama 3.1 70B on the rtx4090-64gb profile: the plain bf16 plan ("before") and the joint
  plan ("after"), with what it picks and the predicted decode tok/s.

    python benchmarks/bench_precision_planner.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from collections.abc import Callable

from workbench.big_modeling.planning import precision_planner
from workbench.models.hardware import load_profile, profile_for_budgets
from workbench.models.intake import open_model
from workbench.models.speed import predict_speed
from workbench.runtime.planning import plan_opened_model
from workbench.runtime.precision_planning import describe_precisions, plan_opened_precisions

PRECISIONS = "int4,int8,bf16"


def best_of(repeat: int, run: Callable[[], object]) -> tuple[float, object]:
    best_s, result = float("inf"), None
    for _ in range(repeat):
        start_s = time.perf_counter()
        result = run()
        best_s = min(best_s, time.perf_counter() - start_s)
    return best_s, result


def bench_405b(repeat: int) -> None:
    opened = open_model("llama-3.1-405b")
    budgets = {0: 80 * 2**30, "cpu": 256 * 2**30, "disk": 2 * 2**40}
    profile = profile_for_budgets(budgets, base=load_profile("rtx4090-64gb"))
    plain_s, _ = best_of(repeat, lambda: plan_opened_model(opened, max_memory=budgets))

    def joint_plan() -> object:
        return plan_opened_precisions(
            opened, max_memory=budgets, precisions=PRECISIONS, profile=profile, min_bits=4.5
        )

    joint_s, joint = best_of(repeat, joint_plan)
    precision_planner._Search.REUSE_INDEX = False  # the search's own switch, for this figure
    try:
        walked_s, _ = best_of(repeat, joint_plan)
    finally:
        precision_planner._Search.REUSE_INDEX = True
    print(f"405B, {PRECISIONS} x (cuda:0 80 GiB, cpu 256 GiB, disk 2 TiB), min 4.5 bits")
    print(f"  infer_auto_device_map   {plain_s * 1e3:8.1f} ms")
    print(
        f"  joint planner           {joint_s * 1e3:8.1f} ms  ({joint_s / plain_s:.1f}x, "
        f"{len(joint.plan.candidates)} candidates placed and scored)"
    )
    print(
        f"  joint, walk per candidate {walked_s * 1e3:6.1f} ms  (the index rebuilt per placement)"
    )
    print(f"  picks {joint.plan.chosen.label}: {joint.prediction.summary()}")


def bench_70b() -> None:
    opened = open_model("llama-3.1-70b")
    base = load_profile("rtx4090-64gb")
    budgets = base.budgets()
    profile = profile_for_budgets(budgets, base=base)
    plain = plan_opened_model(opened, max_memory=budgets)
    before = predict_speed(opened, plain.device_map, profile)
    print("70B on rtx4090-64gb")
    print(f"  before (bf16, plain plan): {before.summary()}")
    for label, kwargs in (
        ("after, int4,int8,bf16", {}),
        ("after, min 4.5 bits, first/last >= int8", {"min_bits": 4.5, "floors": True}),
    ):
        floors = None
        if kwargs.pop("floors", False):
            floors = {"model.layers.0": "int8", "model.layers.79": "int8"}
        joint = plan_opened_precisions(
            opened,
            max_memory=budgets,
            precisions=PRECISIONS,
            profile=profile,
            keep_at_least=floors,
            **kwargs,
        )
        print(f"  {label}: {joint.prediction.summary()} ({joint.plan.chosen.label})")
        for line in describe_precisions(joint):
            print(f"    {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.INFO)
    warnings.simplefilter("ignore")
    bench_405b(args.repeat)
    bench_70b()


if __name__ == "__main__":
    main()
