"""Demo checkpoints made once per session for the model tests (seeded, sharded, tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.models.demo import make_demo


@pytest.fixture(scope="session")
def demo_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~2M-parameter Llama in float16, 3 shards, seed 0."""
    return make_demo(
        tmp_path_factory.mktemp("models") / "llama", arch="llama", params="2M", shards=3
    )


@pytest.fixture(scope="session")
def demo_gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~1M-parameter GPT-2 (tied head) in float32, one file."""
    return make_demo(
        tmp_path_factory.mktemp("models") / "gpt2",
        arch="gpt2",
        params="1M",
        shards=1,
        dtype="float32",
    )
