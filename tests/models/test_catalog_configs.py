"""Bundled configs open and have the real models' parameter counts."""

from __future__ import annotations

import pytest

from workbench.models.catalog import HUB_REPO_IDS, list_bundled_configs
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
