"""The comparison's precision+placement row predicts what the window shows once it is applied:
both count this CPU's timed attention (``machine_attention``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from workbench.models import attention_probe, open_model
from workbench.models.attention_probe import AttentionTimes
from workbench.models.hardware import DETECTED_NAME, load_profile
from workbench.models.kernel_costs import KernelCosts
from workbench.models.matmul_probe import MatmulCurve
from workbench.models.speed import attention_shapes_for, predict_speed
from workbench.runtime.machine_attention import predict_with_attention
from workbench.runtime.planning import attention_layout
from workbench.runtime.precision_session import plan_joint

GIB = 2**30


def test_the_joint_row_counts_this_cpus_timed_attention(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nf4 SmolLM2-135M read 23.1 tok/s in the comparison (attention from its FLOPs: 0.02 ms a
    layer) and 20.0 on the Predicted line once applied (timed: 0.24 ms)."""
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    opened = open_model(str(demo_dir))
    curve = MatmulCurve(
        {dtype: [[2**16, 2e-5], [2**22, 6e-4]] for dtype in ("float32", "float16", "bfloat16")},
        2,
        0.0,
    )
    here = replace(
        load_profile("cpu-laptop-16gb"),
        name=DETECTED_NAME,
        cpu_matmul_curve=curve,
        kernel_costs=KernelCosts(cpu_measured=True),  # nothing to measure first
    )
    timed = AttentionTimes([[512, 1e-3], [4096, 1e-2]], [[256, 1e-3], [2048, 5e-2]], 0.0)
    monkeypatch.setattr(attention_probe, "measure_attention_times_apart", lambda shape: timed)
    layout = attention_layout(opened)
    attention_probe.cached_attention_times(attention_shapes_for(opened.tree, layout))

    outcome = plan_joint(
        opened, budgets={"cpu": GIB, "disk": 100 * GIB}, profile=here, precisions="int8,float16"
    )
    device_map, precisions = outcome.plan.device_map, outcome.joint.plan.precision_map
    shown = predict_with_attention(opened, outcome.tree, device_map, here, precisions=precisions)
    assert outcome.prediction.tokens_per_s == pytest.approx(shown.tokens_per_s)
    assert outcome.prediction.ttft_s == pytest.approx(shown.ttft_s)
    counted = predict_speed(
        outcome.tree, device_map, here, precisions=precisions, attention=layout
    )  # what the row said before: attention from its FLOPs and bytes
    assert counted.tokens_per_s > 1.05 * shown.tokens_per_s
