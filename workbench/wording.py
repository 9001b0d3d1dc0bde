"""Counted nouns and indefinite articles for messages: "1 entry", "2 entries", "an 8-token prompt".

One place for the rule, so no message says "1 entries" or "a 8-token prompt". Imports nothing
from the workbench: every layer (engine, models, runtime, GUI, CLI) may use it.

Example:
    >>> plural(1, "entry"), plural(3, "entry"), plural(2, "device")
    ('1 entry', '3 entries', '2 devices')
    >>> with_article("8-token prompt"), with_article("128-token prompt")
    ('an 8-token prompt', 'a 128-token prompt')
"""

from __future__ import annotations

_IRREGULAR = {"entry": "entries", "index": "indices", "child": "children"}


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """``count`` and ``noun``, the noun in the plural unless ``count`` is 1 (``"1,024 tensors"``).

    Args:
        count: how many.
        noun: the singular noun ("entry").
        plural_form: the plural when it is not regular ("entries" is known already).
    """
    if count == 1:
        return f"1 {noun}"
    many = (
        plural_form
        or _IRREGULAR.get(noun)
        or (noun + "es" if noun.endswith(("s", "x", "ch", "sh")) else noun + "s")
    )
    return f"{count:,} {many}"


def indefinite_article(phrase: str) -> str:
    """ "a" or "an" as the phrase is spoken: "an 8-token", "an 11 GB", "a 128-token", "an hour"
    is not handled (a leading letter counts as spoken: vowels take "an")."""
    text = phrase.lstrip()
    digits = ""
    for char in text:
        if char.isdigit():
            digits += char
        elif char != "," or not digits:
            break
    if digits:
        number = digits.lstrip("0") or "0"
        lead = number[: len(number) % 3 or 3]  # the spoken first group: "11" of 11,000
        return "an" if lead.startswith("8") or lead in ("11", "18") else "a"
    return "an" if text[:1].lower() in ("a", "e", "i", "o", "u") else "a"


def with_article(phrase: str) -> str:
    """``phrase`` after its indefinite article: ``"an 8-token prompt"``."""
    return f"{indefinite_article(phrase)} {phrase}"
