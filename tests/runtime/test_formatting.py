"""How figures read in the GUI: no exponents, sub-millisecond times kept, small transfers."""

from __future__ import annotations

import pytest

from workbench.runtime.formatting import (
    format_bandwidth,
    format_forward,
    format_rate,
    format_seconds,
    format_ttft,
)


@pytest.mark.parametrize(
    ("tokens_per_s", "text"),
    [
        (7731.2, "7,730 tok/s"),
        (312.4, "312 tok/s"),
        (35.24, "35.2 tok/s"),
        (9.996, "10 tok/s"),
        (3.5, "3.5 tok/s"),
        (0.06149, "0.0615 tok/s"),
        (0.0, "0 tok/s"),
        (float("nan"), "-"),
        (float("inf"), "-"),
    ],
)
def test_rates_never_use_scientific_notation(tokens_per_s: float, text: str) -> None:
    assert format_rate(tokens_per_s) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0004, "0.4 ms"),
        (0.00004, "< 0.1 ms"),
        (0.0021, "2.1 ms"),
        (0.25, "250 ms"),
        (2.5, "2.5 s"),
        (340.0, "340 s"),
        (0.0, "0 ms"),
        (float("nan"), "-"),
    ],
)
def test_sub_millisecond_times_do_not_read_as_zero(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


def test_ttft_says_which_prompt_length_it_is_for() -> None:
    assert format_ttft(0.0021, 128) == "2.1 ms for a 128-token prompt"
    assert format_ttft(0.05, None) == "50 ms"


def test_one_forward_says_its_input_length_when_known() -> None:
    assert format_forward(0.0081, 128) == "one forward over 128 tokens in 8.1 ms"
    assert format_forward(0.03, 1) == "one forward over 1 token in 30 ms"
    assert format_forward(0.03, None) == "one forward in 30 ms"
    assert format_forward(0.03, 0) == "one forward in 30 ms"  # a synthetic input


@pytest.mark.parametrize(
    ("bytes_per_s", "text"),
    [
        (2.6e9, "2.6 GB/s"),
        (8e8, "0.8 GB/s"),
        (256 / 0.00014, "1.83 MB/s"),  # a 256-byte norm weight moved in 0.14 ms
        (5e4, "50 kB/s"),
        (0.0, "-"),
    ],
)
def test_small_transfers_keep_a_readable_rate(bytes_per_s: float, text: str) -> None:
    assert format_bandwidth(bytes_per_s) == text
