"""The shared load check and the per-model context of the session (no Qt)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from workbench.runtime.load_check import check_load
from workbench.runtime.session import Session


@pytest.fixture
def opened() -> SimpleNamespace:
    """An opened model with weights: two linear layers on meta (``0.weight``, ``0.bias``, ...)."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    return SimpleNamespace(source="two-layers", model=model, checkpoint="weights")


def test_an_all_disk_map_loads(opened) -> None:
    check = check_load(opened, {"": "disk"})
    assert check.loadable and check.reason == ""


def test_an_uncovered_tensor_makes_the_map_invalid(opened) -> None:
    check = check_load(opened, {"0": "cpu"})
    assert not check.map_valid and not check.loadable
    assert "1.bias" in check.reason and "1.weight" in check.reason


def test_unknown_keys_and_an_empty_map_are_map_problems(opened) -> None:
    assert "not modules or tensors" in check_load(opened, {"": "cpu", "nope": "cpu"}).reason
    assert "empty" in check_load(opened, {}).reason


@pytest.mark.skipif(torch.cuda.device_count() > 7, reason="this machine has a cuda:7")
def test_a_device_this_machine_lacks_is_a_valid_map_that_cannot_load_here(opened) -> None:
    check = check_load(opened, {"0": 7, "1": "cpu"})
    assert check.map_valid and not check.loadable
    assert check.device_problems and "cuda:7" in check.reason


def test_a_model_without_weights_plans_but_does_not_load(opened) -> None:
    opened.checkpoint = None
    check = check_load(opened, {"": "cpu"})
    assert check.map_valid and check.weight_problems and not check.loadable


def test_a_new_model_gets_a_new_context_and_a_resize_keeps_it() -> None:
    session = Session()
    first = session.replace_model("a", SimpleNamespace(tree="tree a"))
    first.comparison = "compared for a"
    session.set_opened(SimpleNamespace(tree="tree a in float16"))  # the same model re-sized
    assert session.context is first and session.tree == "tree a in float16"
    second = session.replace_model("b", SimpleNamespace(tree="tree b"))
    assert second is not first and second.generation == first.generation + 1
    assert second.comparison is None and second.loaded is None
    assert session.source == "b" and session.tree == "tree b"
    session.set_source("c")
    assert session.context is None and session.opened is None
