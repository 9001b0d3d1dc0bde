"""Fixtures shared by every test folder: seeded small checkpoints on disk, and guards."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before anything imports Qt
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never touch the network
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu`` tests cleanly where CUDA is absent."""
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
