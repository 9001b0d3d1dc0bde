"""Size accounting: dtype sizes, memory strings, module sizes, layers, ties, budgets."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.planning.sizes import (
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    format_nbytes,
    format_param_count,
    get_max_layer_size,
    get_max_memory,
)


@pytest.mark.parametrize(
    ("dtype", "nbytes"),
    [
        (torch.float32, 4),
        (torch.bfloat16, 2),
        (torch.float16, 2),
        (torch.float8_e4m3fn, 1),
        (torch.float8_e5m2, 1),
        (torch.int64, 8),
        (torch.bool, 1 / 8),  # the reference counts a bit (the planner: element_nbytes, 1)
        (torch.uint4, 0.5),
        (torch.int2, 0.25),
        (torch.uint1, 0.125),
        (torch.complex64, 8),
    ],
)
def test_dtype_byte_size(dtype: torch.dtype, nbytes: float) -> None:
    assert dtype_byte_size(dtype) == nbytes


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        (1234, 1234),
        ("1234", 1234),
        ("10KB", 10_000),
        ("10kib", 10_240),
        ("1.5 GB", 1_500_000_000),
        ("1.5GiB", 1_610_612_736),
        ("2 TB", 2 * 10**12),
        ("3MiB", 3 * 2**20),
        (" 24GiB ", 24 * 2**30),
        ("7 b", 7),
    ],
)
def test_convert_file_size_to_int(text: int | str, nbytes: int) -> None:
    assert convert_file_size_to_int(text) == nbytes


@pytest.mark.parametrize("bad", ["ten gigs", "12 parsecs", "", "GB", "-1GB", -5, True, None])
def test_convert_file_size_to_int_rejects_garbage_clearly(bad: object) -> None:
    with pytest.raises(BadInputError, match="memory size"):
        convert_file_size_to_int(bad)  # type: ignore[arg-type]


def test_module_sizes_golden(toy_model: nn.Module) -> None:
    sizes = compute_module_sizes(toy_model)
    # Linear(4, 4): 16 weights + 4 biases = 20 x 4 B = 80 B; Linear(4, 2): 10 x 4 B = 40 B
    assert sizes["embed.weight"] == 64
    assert sizes["embed"] == 80
    assert sizes["blocks.0"] == 160
    assert sizes["blocks"] == 480
    assert sizes["head"] == 40
    assert sizes[""] == 600
    # Every module and tensor has an entry.
    names = {n for n, _ in toy_model.named_modules()} | set(toy_model.state_dict())
    assert set(sizes) == names


def test_dtype_changes_floats_only_and_special_dtypes_override() -> None:
    norm = nn.BatchNorm1d(4)  # weight, bias, running_mean, running_var float32; counter int64
    sizes = compute_module_sizes(norm, dtype=torch.float16)
    assert sizes["weight"] == 4 * 2
    assert sizes["running_mean"] == 4 * 2
    assert sizes["num_batches_tracked"] == 8  # int64 never resized
    special = compute_module_sizes(norm, dtype="float16", special_dtypes={"weight": "float32"})
    assert special["weight"] == 16
    assert special[""] == 16 + 3 * 8 + 8
    fp8 = compute_module_sizes(nn.Linear(4, 4), dtype=torch.float8_e4m3fn)
    assert fp8[""] == 20


def test_tied_parameters_are_counted_once() -> None:
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    model[1].weight = model[0].weight
    sizes = compute_module_sizes(model)
    assert sizes[""] == 64
    assert sizes["0.weight"] == 64
    assert sizes["1.weight"] == 0
    assert find_tied_parameters(model) == [["0.weight", "1.weight"]]


def test_find_tied_parameters_on_transformers_models(tiny_llama, tiny_gpt2, tiny_bert) -> None:
    assert find_tied_parameters(tiny_llama) == [["lm_head.weight", "model.embed_tokens.weight"]]
    assert find_tied_parameters(tiny_gpt2) == [["lm_head.weight", "transformer.wte.weight"]]
    assert find_tied_parameters(tiny_bert) == []


def test_llama_sizes_match_the_parameter_count(tiny_llama, llama_config) -> None:
    sizes = compute_module_sizes(tiny_llama, dtype=torch.bfloat16)
    unique_params = sum(p.numel() for p in tiny_llama.parameters())
    buffer_nbytes = compute_module_total_buffer_size(tiny_llama, dtype=torch.bfloat16)
    assert sizes[""] == unique_params * 2 + buffer_nbytes
    layer = sizes["model.layers.0"]
    h, i, kv = 64, 128, 2 * 16  # hidden, intermediate, kv heads x head_dim
    # q, o: h*h; k, v: h*kv; gate, up, down: h*i; two RMSNorm weights: h
    assert layer == (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h) * 2


def test_total_buffer_size() -> None:
    # running_mean + running_var: 2 x 3 x 4 B; num_batches_tracked: 8 B
    assert compute_module_total_buffer_size(nn.BatchNorm1d(3)) == 32
    assert compute_module_total_buffer_size(nn.BatchNorm1d(3), dtype=torch.float16) == 20


def test_get_max_layer_size_respects_no_split(toy_model: nn.Module) -> None:
    sizes = compute_module_sizes(toy_model)
    children = list(toy_model.named_children())
    assert get_max_layer_size(children, sizes, []) == (
        80,
        ["embed", *(f"blocks.{b}.linear{k}" for b in range(3) for k in (1, 2))],
    )
    assert get_max_layer_size(children, sizes, ["ToyBlock"]) == (
        160,
        ["blocks.0", "blocks.1", "blocks.2"],
    )


def test_get_max_memory_converts_orders_and_does_not_mutate() -> None:
    budgets = {"cpu": "2GiB", "disk": "1TB", "cuda:1": "24GiB", 0: 1000}
    snapshot = dict(budgets)
    result = get_max_memory(budgets)
    assert budgets == snapshot
    assert list(result) == [0, 1, "cpu", "disk"]
    assert result == {0: 1000, 1: 24 * 2**30, "cpu": 2 * 2**30, "disk": 10**12}


def test_get_max_memory_lists_every_bad_entry() -> None:
    with pytest.raises(BadInputError, match="2 bad entries") as error:
        get_max_memory({"gpu0": "1GB", 0: "lots"})
    assert "'gpu0'" in str(error.value) and "'lots'" in str(error.value)


def test_get_max_memory_detects_free_ram() -> None:
    detected = get_max_memory()
    assert detected.get("cpu", detected.get("mps", 0)) > 0
    if not torch.cuda.is_available():
        assert not [device for device in detected if isinstance(device, int)]


def test_format_nbytes() -> None:
    assert format_nbytes(512) == "512 B"
    assert format_nbytes(1.6 * 2**30) == "1.6 GiB"
    assert format_nbytes(3 * 2**40) == "3 TiB"
    assert format_nbytes(-1536) == "-1.5 KiB"
    assert format_nbytes(123.4 * 2**20) == "123 MiB"
    assert format_nbytes(5 * 2**50) == "5 PiB"
    assert format_param_count(70_553_706_496) == "70.6B"
    assert format_param_count(1_234) == "1.23K" and format_param_count(12) == "12"
