"""Bundled configs open and have the real models' parameter counts."""

from __future__ import annotations

import pytest

from workbench.models.catalog import (
    HUB_REPO_IDS,
    bundled_config_path,
    hub_repo_id,
    list_bundled_configs,
)
from workbench.models.intake import open_model

# Published parameter counts (tied weights once), as transformers builds them.
SMALL = {
    "gpt2": 124_439_808,
    "bert-base-uncased": 109_514_298,
    "llama-3.1-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
}
LARGE = {
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "mixtral-8x7b": 46_702_792_704,
    "qwen3-30b-a3b": 30_532_122_624,
    # 671B main model; the multi-token-prediction layer (num_nextn_predict_layers, +14B in
    # the published checkpoint) is not part of transformers' DeepseekV3ForCausalLM
    "deepseek-v3": 671_026_404_352,
}


def test_catalog_lists_every_bundled_config() -> None:
    names = [entry.name for entry in list_bundled_configs()]
    assert set(SMALL) | set(LARGE) | {"tiny-llama-demo"} == set(names)
    assert set(HUB_REPO_IDS) == set(SMALL) | set(LARGE)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_configs_have_real_counts(name: str) -> None:
    assert open_model(name).tree.root.param_count == SMALL[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LARGE))
def test_large_configs_have_real_counts(name: str) -> None:
    opened = open_model(name)
    assert opened.tree.root.param_count == LARGE[name]
    assert opened.no_split_modules  # decoder layers never split


def test_hub_repo_id_knows_bundled_configs_by_name_or_file_and_hf_cache_sources(
    tmp_path,
) -> None:
    assert hub_repo_id("llama-3.1-70b") == "meta-llama/Llama-3.1-70B"
    assert hub_repo_id("gpt2.json") == "openai-community/gpt2"
    assert hub_repo_id(str(bundled_config_path("qwen3-30b-a3b"))) == "Qwen/Qwen3-30B-A3B"
    assert hub_repo_id("hf-cache:org/model") == "org/model"
    assert hub_repo_id("tiny-llama-demo") is None  # bundled, but not on the Hub
    copy = tmp_path / "llama-3.1-70b.json"  # same stem, but the user's own file
    copy.write_text(bundled_config_path("llama-3.1-70b").read_text())
    assert hub_repo_id(str(copy)) is None
    assert hub_repo_id(str(tmp_path)) is None
    assert hub_repo_id("no-such-model") is None
