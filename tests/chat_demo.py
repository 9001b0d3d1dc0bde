"""A small random Llama demo whose tokenizer has a chat template (``DEMO_CHAT_TEMPLATE``), for
tests of the chat path that need no real model."""

from __future__ import annotations

from pathlib import Path

from workbench.models import make_demo
from workbench.models.tokenizer import save_demo_tokenizer


def make_chat_demo(folder: Path, *, params: str = "2M") -> Path:
    """``make_demo(folder)`` (llama, seeded), then its tokenizer rewritten with the chat
    template; the vocabulary is the same (training is deterministic), so the weights fit."""
    made = Path(make_demo(folder, arch="llama", params=params, shards=2, seed=0))
    save_demo_tokenizer(made, "llama", chat_template=True)
    return made
