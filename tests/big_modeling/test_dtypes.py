"""The one dtype vocabulary: every parser in the app accepts the same names and aliases."""

from __future__ import annotations

import pytest
import torch

from workbench.big_modeling.dtypes import (
    AS_STORED,
    DTYPE_CHOICES,
    dtype_name,
    lookup_dtype,
    parse_dtype,
    to_dtype,
)
from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.loading.plan import parse_dtype as parse_load_dtype
from workbench.big_modeling.planning.dtype_sizes import as_dtype

ALL_TORCH_DTYPES = sorted(
    {value for value in vars(torch).values() if isinstance(value, torch.dtype)}, key=str
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bf16", torch.bfloat16),
        ("BF16", torch.bfloat16),
        (" torch.bfloat16 ", torch.bfloat16),
        ("fp16", torch.float16),
        ("half", torch.float16),
        ("float", torch.float32),
        ("fp32", torch.float32),
        ("double", torch.float64),
        ("fp8", torch.float8_e4m3fn),
        ("float8_e4m3fn", torch.float8_e4m3fn),
        ("int8", torch.int8),
        (torch.float16, torch.float16),
    ],
)
def test_names_and_aliases_parse_to_the_dtype(
    text: str | torch.dtype, expected: torch.dtype
) -> None:
    assert to_dtype(text) is expected
    assert parse_dtype(text) is expected
    assert lookup_dtype(text) is expected


@pytest.mark.parametrize("dtype", ALL_TORCH_DTYPES, ids=str)
def test_every_torch_dtype_round_trips_through_its_name(dtype: torch.dtype) -> None:
    assert to_dtype(dtype_name(dtype)) is dtype
    assert to_dtype(str(dtype)) is dtype  # "torch.float16" as str() spells it


@pytest.mark.parametrize("text", [None, "", "auto", "none", "As Stored", AS_STORED])
def test_no_dtype_spellings_mean_as_stored(text: str | None) -> None:
    assert parse_dtype(text) is None
    assert dtype_name(None) == AS_STORED


@pytest.mark.parametrize("bad", ["float13", "Tensor", "nn", "torch.", "float16x"])
def test_a_bad_name_is_named_in_the_error_with_the_usual_choices(bad: str) -> None:
    with pytest.raises(BadInputError, match=rf"dtype {bad!r} is not a torch dtype") as info:
        to_dtype(bad)
    assert all(choice in str(info.value) for choice in DTYPE_CHOICES)
    assert "bf16" in str(info.value)
    assert lookup_dtype(bad) is None


def test_non_strings_are_not_names() -> None:
    assert lookup_dtype(16) is None and lookup_dtype(None) is None
    with pytest.raises(BadInputError, match="is not a torch dtype"):
        to_dtype(16)  # type: ignore[arg-type]


def test_the_choices_are_canonical_names() -> None:
    assert all(dtype_name(to_dtype(choice)) == choice for choice in DTYPE_CHOICES)


def test_engine_parsers_share_the_vocabulary() -> None:
    assert as_dtype("bf16") is torch.bfloat16  # size accounting
    assert parse_load_dtype("fp16") is torch.float16  # checkpoint loading
    with pytest.raises(BadInputError, match="not a floating dtype"):
        parse_load_dtype("int8")  # loading casts floating weights only
    with pytest.raises(BadInputError, match="'float13' is not a torch dtype"):
        as_dtype("float13")
