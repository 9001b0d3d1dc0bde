"""The one "export to code" writer: budgets written so accelerate reads back the same bytes."""

from __future__ import annotations

import pytest
import torch

from workbench.runtime.map_code import checkpoint_location, format_budget, from_pretrained_code

BUDGETS = {0: 1234567891, "cpu": 24 * 2**30, "disk": 2 * 10**12}


def run_until_load(code: str) -> dict:
    """Run ``code`` up to the ``from_pretrained`` call (no weights are read); return its names."""
    namespace: dict = {}
    exec(code.split("\nmodel = ", maxsplit=1)[0], namespace)
    return namespace


def budgets_read_back(max_memory: dict) -> dict:
    """The bytes transformers asks accelerate for, per device, from a ``max_memory`` literal."""
    accelerate_utils = pytest.importorskip("accelerate.utils")
    return {
        device: accelerate_utils.convert_file_size_to_int(v) for device, v in max_memory.items()
    }


def test_budgets_are_exact_and_keep_the_disk() -> None:
    assert format_budget(1234567891) == 1234567891  # no unit divides it: the int itself
    assert format_budget(24 * 2**30) == "24GiB"
    assert format_budget(2**40) == "1024GiB"  # accelerate has no TiB
    assert format_budget(2 * 10**12) == "2000GB"
    code = from_pretrained_code(
        model_class="LlamaForCausalLM",
        location="meta-llama/Llama-3.1-8B",
        device_map={"model": 0, "lm_head": "disk"},
        max_memory=BUDGETS,
        dtype=torch.bfloat16,
    )
    namespace = run_until_load(code)
    assert namespace["device_map"] == {"model": 0, "lm_head": "disk"}
    assert namespace["max_memory"] == {0: 1234567891, "cpu": "24GiB", "disk": "2000GB"}
    assert budgets_read_back(namespace["max_memory"]) == BUDGETS
    assert code.startswith("import torch\n") and "    dtype=torch.bfloat16,\n" in code
    assert '    offload_folder="offload",\n' in code


def test_code_without_a_dtype_does_not_import_torch() -> None:
    code = from_pretrained_code(
        model_class="GPT2LMHeadModel",
        location="openai-community/gpt2",
        device_map={"": "cpu"},
        max_memory={"cpu": 2**30},
    )
    assert "torch" not in code and "offload_folder" not in code
    compile(code, "<code>", "exec")


def test_checkpoint_location(tmp_path) -> None:
    assert checkpoint_location("hf-cache:org/name", tmp_path) == ("org/name", None)
    assert checkpoint_location(str(tmp_path), tmp_path) == (str(tmp_path), None)
    assert checkpoint_location("llama-3.1-8b", None) == ("meta-llama/Llama-3.1-8B", None)
    location, comment = checkpoint_location("tiny-lm", None)
    assert location == "path/to/checkpoint"
    assert comment == "# tiny-lm holds no weights: put its Hub repo id or weights folder here"
