"""One planning path: ``workbench plan`` and the planner panel's comparison plan the same map."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.commands import plan as plan_command
from workbench.models.device_probe import CpuKernelProbe, cached_cpu_kernels
from workbench.models.hardware import detect_hardware, with_cpu_kernels
from workbench.models.intake import open_model
from workbench.models.speed import predict_speed
from workbench.runtime import planning
from workbench.runtime.planning import (
    MemoryOptions,
    activation_reserve,
    attention_layout,
    execution_reserve,
    plan_opened_model,
    planning_dtype,
)
from workbench.runtime.strategy_compare import PlanRequest, run_comparison


@pytest.mark.parametrize("strategy", ["auto", "sequential"])
def test_the_cli_and_the_comparison_plan_the_same_map(
    demo_dir: Path, capsys: pytest.CaptureFixture[str], strategy: str
) -> None:
    opened = open_model(demo_dir)
    layer = opened.tree.node("model.layers.0").nbytes
    # no memory flags: the CLI plans with the GUI's default options (MemoryOptions()), so the
    # cpu keeps the reserve of every layer it runs free beside about two layers
    memory = MemoryOptions()
    reserve = execution_reserve(opened, memory)
    budgets: dict[int | str, int] = {"cpu": int(2.5 * layer) + reserve, "disk": 2**30}
    assert main(["plan", str(demo_dir), "--max-memory", f"cpu={budgets['cpu']}", "disk=1GiB",
                 "--strategy", strategy, "--json"]) == 0  # fmt: skip
    from_cli = json.loads(capsys.readouterr().out)
    request = PlanRequest(
        model=opened.model,
        tree=opened.tree,
        profile=None,
        budgets=budgets,
        reserve={},
        dtype=None,
        no_split=list(opened.no_split_modules),
        strategies=(strategy,),
        opened=opened,
        memory=memory,
    )
    (candidate,) = run_comparison(request)
    assert candidate.error == ""
    assert candidate.plan.device_map == from_cli["device_map"]
    direct = plan_opened_model(opened, max_memory=budgets, strategy=strategy, memory=memory)
    assert direct.device_map == from_cli["device_map"]
    assert {str(d): n for d, n in direct.per_device_bytes.items()} == from_cli["per_device_bytes"]
    assert from_cli["reserve"] == {"cpu": reserve} == {str(d): n for d, n in direct.reserve.items()}
    assert set(direct.device_map.values()) == {"cpu", "disk"}  # the budget forces an offload


def test_the_reserve_follows_the_weights_dtype(demo_dir: Path) -> None:
    opened = open_model(demo_dir)
    assert str(planning_dtype(opened)) == "torch.float16"  # the demo's one stored dtype
    small = activation_reserve(opened, 1, 16)
    assert 0 < small < activation_reserve(opened, 4, 256)
    assert activation_reserve(opened, 1, 16, "float32") > small


def test_the_cli_offers_the_runtimes_strategies() -> None:
    assert plan_command.STRATEGIES == planning.STRATEGIES  # its parser needs them without torch


def test_with_precisions_every_row_is_predicted_on_the_measured_kernels(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The joint row measures this CPU's kernels during the comparison; the plain rows beside
    it are predicted on the same figures, not on the profile captured before the probe."""
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    stale = detect_hardware(measure_links=False)
    assert not stale.kernel_costs.cpu_measured  # captured before any probe (a fresh machine)
    probe = CpuKernelProbe(
        bf16_gbps=1.5,  # far from the detected bandwidth: the plain rows' speed must move
        efficiency={"plain": 1.0, "int8": 0.3},
        seconds={"plain": 0.01, "int8": 0.02},
        threads=2,
        nbytes=2**20,
        measured_at=0.0,
    )
    cached_cpu_kernels(lambda: probe)  # what the joint row's probe finds (measured once)
    opened = open_model(demo_dir)
    request = PlanRequest(
        model=opened.model,
        tree=opened.tree,
        profile=stale,
        budgets={"cpu": 2**30},
        reserve={},
        dtype=None,
        no_split=list(opened.no_split_modules),
        strategies=("auto",),
        opened=opened,
        precisions="int8,float16",
    )
    plain, joint = run_comparison(request)
    assert plain.strategy == "auto" and joint.error == ""
    measured = with_cpu_kernels(stale, probe)
    layout = attention_layout(opened)  # each row counts the model's attention
    expected = predict_speed(opened.tree, plain.plan.device_map, measured, attention=layout)
    assert plain.prediction.tokens_per_s == pytest.approx(expected.tokens_per_s)
    before = predict_speed(opened.tree, plain.plan.device_map, stale, attention=layout)
    assert plain.prediction.tokens_per_s != pytest.approx(before.tokens_per_s)
