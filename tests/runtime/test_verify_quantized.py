"""Quantized verify on a real demo Llama: a bf16 map is bitwise identical, int8/int4 agree less.

The demo (``make_demo``, 2M parameters, bf16) has random weights, so its next-token logits are
nearly flat: the top two tokens are often a few hundredths apart, and int4's logit error
(max |dlogit| about 0.25 measured) flips many of them. Measured on the fixed text prompts
(220 positions): int8 96% (212/220), int4-g32 64% (142/220), int4-g64 65% (144/220). The bounds
below are loose (int8 >= 90%, int4 >= 50%) because a trained model's margins are far larger; they
still catch a broken rebuild (a wrong scale or packing gives ~1/774 agreement, i.e. chance).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tests.big_modeling.test_quantized_loads import DEVICE_MAP  # the cpu + disk split
from workbench.big_modeling import init_empty_weights, load_checkpoint_and_dispatch
from workbench.big_modeling.errors import BadInputError
from workbench.models.demo import make_demo
from workbench.runtime.verify_quantized import (
    FIXED_PROMPTS,
    QuantizedAgreement,
    compare_quantized,
    prompt_ids,
)


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo(
        tmp_path_factory.mktemp("verify_q") / "demo", params="2M", shards=2, dtype="bfloat16"
    )


@pytest.fixture(scope="module")
def reference(demo_folder: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(demo_folder, dtype=torch.bfloat16).eval()


@pytest.fixture(scope="module")
def prompts(demo_folder: Path) -> list[torch.Tensor]:
    return prompt_ids(AutoTokenizer.from_pretrained(demo_folder), 774)


def load(folder: Path, offload: Path, precision_map: dict[str, str]) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(folder)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return load_checkpoint_and_dispatch(
        model, folder, device_map=DEVICE_MAP, offload_folder=offload, precision_map=precision_map
    )


def test_a_bfloat16_map_agrees_everywhere_bit_for_bit(
    demo_folder: Path, reference: torch.nn.Module, prompts: list, tmp_path: Path
) -> None:
    model = load(demo_folder, tmp_path / "offload", {"": "bfloat16"})
    result = compare_quantized(model, reference, prompts)
    assert result.positions == sum(ids.shape[1] for ids in prompts)
    assert result.agreed == result.positions and result.agreement == 1.0
    assert result.bitwise_identical and result.max_abs_logit_diff == 0.0
    assert result.describe() == f"bitwise identical ({result.positions} positions)"


def test_int4_agrees_less_than_int8_but_far_above_chance(
    demo_folder: Path, reference: torch.nn.Module, prompts: list, tmp_path: Path
) -> None:
    int8 = compare_quantized(
        load(demo_folder, tmp_path / "a", {"model.layers": "int8"}), reference, prompts
    )
    int4 = compare_quantized(
        load(demo_folder, tmp_path / "b", {"model.layers": "int4-g32"}), reference, prompts
    )
    assert not int8.bitwise_identical and not int4.bitwise_identical
    assert int8.agreement >= 0.9
    assert 0.5 <= int4.agreement < 1.0
    assert int4.agreement < int8.agreement
    assert int4.mean_abs_logit_diff > int8.mean_abs_logit_diff > 0
    assert int4.max_abs_logit_diff >= int4.mean_abs_logit_diff
    assert int4.describe().startswith(f"top-1 agreement {int(100 * int4.agreement)}% (")


def test_prompt_set_is_fixed() -> None:
    first = prompt_ids(None, 774)
    second = prompt_ids(None, 774)
    assert len(first) == 8 and all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert all(int(ids.max()) < 774 for ids in first)
    assert len(FIXED_PROMPTS) == 8


def test_describe_and_errors() -> None:
    # 31 of 32: int(96.875) = 96
    assert QuantizedAgreement(32, 31, 0.41, 0.052, False).describe() == (
        "top-1 agreement 96% (31/32), max |dlogit| 0.41, mean |dlogit| 0.052"
    )
    with pytest.raises(BadInputError, match="at least one prompt"):
        compare_quantized(torch.nn.Identity(), torch.nn.Identity(), [])
    with pytest.raises(BadInputError, match="vocab_size must be at least 1"):
        prompt_ids(None, 0)


def test_cli_run_quantize_verify_reports_agreement(demo_folder: Path, tmp_path: Path) -> None:
    """``workbench run --quantize int8 --verify`` in a real process (jobs run in-process there)."""
    command = [sys.executable, "-m", "workbench", "run", str(demo_folder), "--quantize", "int8"]
    done = subprocess.run(
        [*command, "--verify", "--in-process", "--json", "--max-new-tokens", "2"],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    verify = json.loads(done.stdout)["verify"]
    assert verify["top1_positions"] == 220  # the 8 fixed text prompts, every position
    assert 0.9 * 220 <= verify["top1_agreed"] < 220  # measured 212/220
    assert verify["passed"] and not verify["exact"]
