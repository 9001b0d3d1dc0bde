"""Device-map arithmetic shared by the GUI and the CLI."""

from __future__ import annotations

from torch import nn

from workbench.commands.plan import compress_names
from workbench.models.tree import build_module_tree
from workbench.runtime.map_edits import compact_names, key_problems


def test_compact_names_groups_numbered_runs() -> None:
    names = ["m.embed", "m.layers.0", "m.layers.1", "m.layers.2", "m.layers.4", "m.norm"]
    assert compact_names(names) == ["m.embed", "m.layers.0-2", "m.layers.4", "m.norm"]


def test_the_cli_lists_the_same_runs_up_to_a_limit() -> None:
    names = [*(f"model.layers.{i}" for i in (0, 1, 2, 4, 6, 8, 10, 12)), "lm_head"]
    assert compress_names([*names[:4], "lm_head"]) == "model.layers.0-2, model.layers.4, lm_head"
    assert compress_names(names, limit=3) == (
        "model.layers.0-2, model.layers.4, model.layers.6, ... (4 more)"
    )


def test_key_problems_name_the_first_few_then_count_the_rest() -> None:
    names = [f"block_{letter}" for letter in "abcdefghijklmnopqrst"]  # 20 distinct names
    tree = build_module_tree(nn.ModuleDict({name: nn.Linear(1, 1) for name in names}))
    problems = key_problems(tree, {"block_a": "cpu", "ghost": 0, "phantom": 1}, "m.json")
    assert problems[0] == "m.json names 2 module(s) not in the model: ghost, phantom"
    assert problems[1] == ("m.json gives no device to " + ", ".join(names[1:13]) + " … and 7 more")
    assert key_problems(tree, {"": "cpu"}, "m.json") == []
