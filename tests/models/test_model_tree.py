"""The module tree: golden byte counts, tied and no-split flags, structure, engine agreement."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench.big_modeling.empty_init import init_empty_weights
from workbench.big_modeling.planning.sizes import compute_module_sizes
from workbench.models.intake import open_model
from workbench.models.tree import build_module_tree, dtype_nbytes, tree_to_dict


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 2)  # 4*2 + 2 = 10 params
        self.register_buffer("steps", torch.zeros(3, dtype=torch.int64))  # 3*8 B = 24 B


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 4)  # 20 params
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 5, bias=False)  # 20 params, tied to embed
        self.head.weight = self.embed.weight


def test_golden_bytes_as_stored_and_in_a_planning_dtype() -> None:
    tree = build_module_tree(Toy(), no_split_classes=["Block"])
    # params: embed 20 + 2 blocks * 10 (tied head counted once) = 40; float32 = 160 B
    # buffers: 2 * 24 B (int64 keeps its size in any planning dtype)
    assert tree.root.param_count == 40
    assert tree.root.stored_nbytes == 40 * 4 + 2 * 24
    assert tree.node("blocks.0").stored_nbytes == 10 * 4 + 24
    half = build_module_tree(Toy(), dtype=torch.float16)
    assert half.root.nbytes == 40 * 2 + 2 * 24
    assert half.root.stored_nbytes == 40 * 4 + 2 * 24
    assert half.node("blocks.1.proj").nbytes == 10 * 2


def test_tied_weights_are_counted_once_and_flagged() -> None:
    tree = build_module_tree(Toy())
    assert tree.tied_groups == [["embed.weight", "head.weight"]]
    assert tree.node("embed").tied and tree.node("head").tied
    assert not tree.node("blocks.0.proj").tied
    assert tree.node("head").param_count == 0  # the alias adds nothing
    assert "head.weight" in tree.leaf_tensors and "head.weight" not in tree.tensor_nbytes


def test_structure_rows_parents_and_order() -> None:
    tree = build_module_tree(Toy(), no_split_classes=["Block"])
    names = [node.name for node in tree.iter_nodes()]
    assert names == [name for name, _ in Toy().named_modules()]
    assert len(tree) == len(names)
    blocks = tree.node("blocks")
    assert [child.short_name for child in blocks.children] == ["0", "1"]
    assert [child.row for child in blocks.children] == [0, 1]
    assert blocks.children[1].parent is blocks
    assert tree.node("blocks.0").no_split and not tree.node("blocks").no_split
    assert tree.node("blocks.0").tensor_names == ["blocks.0.steps"]
    assert tree.node("blocks.0.proj").depth == 3 and tree.root.depth == 0
    with pytest.raises(KeyError, match=r"blocks.7.proj.*closest existing module: 'blocks'"):
        tree.node("blocks.7.proj")


def test_meta_model_matches_the_engine_sizes(demo_llama_dir) -> None:
    opened = open_model(demo_llama_dir)
    with init_empty_weights():
        model = type(opened.model)(opened.config)
    for dtype in (None, torch.float16, torch.float32):
        tree = build_module_tree(model, dtype=dtype)
        assert tree.module_sizes() == compute_module_sizes(model, dtype=dtype)


def test_stored_sizes_override_and_json_depth() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    tree = build_module_tree(
        model, stored_nbytes={"0.weight": 1000}, stored_dtypes={"0.weight": torch.float16}
    )
    assert tree.node("0").stored_nbytes == 1000 + 2 * 4
    assert tree.node("0").nbytes == 1000 + 2 * 4  # no planning dtype: as stored
    data = tree_to_dict(tree.root, max_depth=0)
    assert data["params"] == 12 and "children" not in data
    assert [c["name"] for c in tree_to_dict(tree.root, max_depth=1)["children"]] == ["0", "1"]


def test_dtype_nbytes() -> None:
    assert dtype_nbytes(torch.bfloat16) == 2
    assert dtype_nbytes(torch.float8_e4m3fn) == 1
    assert dtype_nbytes(torch.int64) == 8
    assert dtype_nbytes(torch.bool) == 1
