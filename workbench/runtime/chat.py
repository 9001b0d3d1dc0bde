"""A chat's prompt: the tokenizer's chat template when it has one, plain text lines otherwise.

A chat is ``(role, content)`` pairs (``"system"``, ``"user"``, ``"assistant"``) ending with the
user's turn. With a template the prompt is what ``transformers`` would give the model
(``apply_chat_template(..., add_generation_prompt=True)``); without one it is "Role: text"
lines ending in "Assistant:", the raw mode a base model continues. Generation stops at the
model's end-of-turn tokens (``generation_config.eos_token_id`` and the tokenizer's EOS).

Example:
    >>> plain_chat_text((("system", "Be brief."), ("user", "Hi")))
    'System: Be brief.\\nUser: Hi\\nAssistant:'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.big_modeling.errors import BadInputError

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatPrompt:
    """The token ids ``(1, T)`` of a chat prompt, its text, and whether a template built it."""

    input_ids: torch.Tensor
    text: str
    chat_template: bool


def has_chat_template(tokenizer: Any) -> bool:
    """True when ``tokenizer`` carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def check_messages(messages: Sequence[tuple[str, str]]) -> None:
    """Raises ``BadInputError`` unless ``messages`` is a chat that ends with the user's turn."""
    if not messages:
        raise BadInputError("the chat is empty; it needs at least one user message")
    bad = sorted({role for role, _ in messages if role not in ROLES})
    if bad:
        raise BadInputError(
            f"unknown chat role(s) {', '.join(bad)}; use {', '.join(ROLES)} ('system' first)"
        )
    if messages[-1][0] != "user":
        raise BadInputError(
            f"the chat ends with a {messages[-1][0]!r} message; it must end with the user's turn"
        )


def plain_chat_text(messages: Sequence[tuple[str, str]]) -> str:
    """The chat as "Role: text" lines, ending with "Assistant:" for the model to continue."""
    lines = [f"{role.capitalize()}: {content}" for role, content in messages]
    return "\n".join([*lines, "Assistant:"])


def chat_prompt(tokenizer: Any, messages: Sequence[tuple[str, str]]) -> ChatPrompt:
    """Tokenize the chat ``messages`` for the model that ``tokenizer`` belongs to.

    Raises:
        BadInputError: for a malformed chat, or a chat template that fails on it (the message
            quotes the template's error, e.g. a template that refuses a system message).
    """
    check_messages(messages)
    if has_chat_template(tokenizer):
        chat = [{"role": role, "content": content} for role, content in messages]
        try:
            text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # jinja errors: the template's own message says what it wants
            raise BadInputError(f"the model's chat template refused this chat: {exc}") from exc
        # the template writes the special tokens itself (BOS, turn markers)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        return ChatPrompt(ids.to(torch.long), str(text), True)
    text = plain_chat_text(messages)
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    return ChatPrompt(ids.to(torch.long), text, False)


def stop_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The ids that end a turn: the generation config's EOS id(s) and the tokenizer's EOS."""
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    for source in (getattr(config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source if isinstance(i, int))
    return frozenset(ids)
