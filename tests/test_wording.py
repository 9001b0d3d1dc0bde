"""Counted nouns and articles (issue 14: "1 entries", "a 8-token prompt")."""

from __future__ import annotations

import pytest

from workbench.runtime.formatting import format_ttft
from workbench.wording import indefinite_article, plural, with_article


@pytest.mark.parametrize(
    ("count", "noun", "expected"),
    [
        (1, "entry", "1 entry"),
        (0, "entry", "0 entries"),
        (2, "device", "2 devices"),
        (1, "device", "1 device"),
        (3, "match", "3 matches"),
        (1024, "tensor", "1,024 tensors"),
    ],
)
def test_plural(count: int, noun: str, expected: str) -> None:
    assert plural(count, noun) == expected


@pytest.mark.parametrize(
    ("phrase", "article"),
    [
        ("8-token prompt", "an"),
        ("80-token prompt", "an"),
        ("800-token prompt", "an"),
        ("11-token prompt", "an"),
        ("18 GB model", "an"),
        ("11,000-token prompt", "an"),
        ("1-token prompt", "a"),
        ("128-token prompt", "a"),
        ("110-token prompt", "a"),
        ("2048-token prompt", "a"),
        ("error", "an"),
        ("load", "a"),
    ],
)
def test_indefinite_article(phrase: str, article: str) -> None:
    assert indefinite_article(phrase) == article


def test_the_ttft_wording_uses_the_article_the_number_takes() -> None:
    assert format_ttft(0.0021, 8) == "2.1 ms for an 8-token prompt"
    assert format_ttft(0.0021, 128) == "2.1 ms for a 128-token prompt"
    assert with_article("8-token prompt") == "an 8-token prompt"
