"""The joint planner walks the model once and re-sizes its index per candidate (issue 19): the
plans it makes are the ones the per-candidate walk (``module_sizes=``) made, candidate by
candidate, on two bundled configs of different shapes (a dense Llama, a mixture of experts)."""

from __future__ import annotations

from typing import Any

import pytest
from torch import nn

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.planning import precision_planner
from workbench.big_modeling.planning.module_index import ModuleIndex
from workbench.big_modeling.planning.planner import plan_device_map
from workbench.models.hardware import load_profile, profile_for_budgets
from workbench.models.intake import open_model
from workbench.runtime.precision_planning import plan_opened_precisions


def _candidates(result: Any) -> list[tuple]:
    return [
        (
            c.label,
            c.layer_precisions,
            c.device_map,
            c.per_device_bytes,
            c.tokens_per_s,
            c.average_bits,
            c.problem,
        )
        for c in result.plan.candidates
    ]


@pytest.mark.parametrize(
    ("name", "budgets", "min_bits"),
    [
        ("llama-3.1-8b", {0: 6 * 2**30, "cpu": 8 * 2**30, "disk": 2**40}, 4.5),
        ("mixtral-8x7b", {0: 24 * 2**30, "cpu": 64 * 2**30, "disk": 2**40}, None),
    ],
)
def test_the_reused_index_plans_what_the_walk_per_candidate_plans(
    name: str, budgets: dict, min_bits: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = open_model(name)
    profile = profile_for_budgets(budgets, base=load_profile("rtx4090-64gb"))

    def run() -> Any:
        return plan_opened_precisions(
            opened,
            max_memory=budgets,
            precisions="int4,int8,bf16",
            profile=profile,
            min_bits=min_bits,
        )

    reused = run()
    monkeypatch.setattr(precision_planner._Search, "REUSE_INDEX", False)
    walked = run()
    assert len(reused.plan.candidates) > 3
    assert _candidates(reused) == _candidates(walked)
    assert reused.plan.precision_map == walked.plan.precision_map
    assert reused.plan.device_map == walked.plan.device_map
    # the search put layers on more than one device, so sizes decided something
    assert len({d for c in reused.plan.candidates for d in c.device_map.values()}) > 1


def test_a_resized_index_is_planned_with_its_sizes_and_must_be_the_models() -> None:
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)])  # 80 B each
    index = ModuleIndex.build(model)
    heavy = index.resized([index.sizes[0] + 80, 80, 80, 80, 160])  # the last one doubled
    plan = plan_device_map(
        model, max_memory={0: 250, "cpu": 1000}, strategy="sequential", module_index=heavy
    )
    assert plan.device_map == {"0": 0, "1": "cpu", "2": "cpu", "3": "cpu"}
    assert index.sizes == [320, 80, 80, 80, 80]  # the caller's index is left as it was
    with pytest.raises(ValueError, match="5 modules"):
        index.resized([1, 2])
    with pytest.raises(BadInputError, match="not an index of this model"):
        plan_device_map(nn.Linear(4, 4), max_memory={0: 250}, module_index=index)
