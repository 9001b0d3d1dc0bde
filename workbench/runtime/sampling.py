"""Choosing the next token from a forward's logits: greedy, or sampled with temperature,
top-k and top-p, after a repetition penalty.

The rules are those of ``transformers``' logits processors (``RepetitionPenaltyLogitsProcessor``,
``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``), applied in that order,
so a setting means here what it means in ``GenerationConfig``. Sampling runs on the CPU with a
seeded generator: the same seed, prompt and weights give the same tokens on every map.

Example:
    >>> import torch
    >>> picker = TokenPicker(Sampling())
    >>> picker.pick(torch.tensor([[0.1, 2.0, -1.0]]), [])
    1
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from workbench.big_modeling.errors import BadInputError
from workbench.runtime.protocol import Sampling

__all__ = ["Sampling", "TokenPicker", "check_sampling", "describe_sampling", "sampling_dict"]


def check_sampling(sampling: Sampling) -> Sampling:
    """Return ``sampling`` when its values make sense.

    Raises:
        BadInputError: naming each bad setting, what it must be and what it is.
    """
    problems = []
    if not sampling.greedy and not sampling.temperature > 0:
        problems.append(f"temperature must be > 0 when sampling, got {sampling.temperature}")
    if not 0 < sampling.top_p <= 1:
        problems.append(f"top_p must be in (0, 1], got {sampling.top_p}")
    if sampling.top_k < 0:
        problems.append(f"top_k must be >= 0 (0: no limit), got {sampling.top_k}")
    if not sampling.repetition_penalty > 0:
        problems.append(
            f"repetition_penalty must be > 0 (1: none), got {sampling.repetition_penalty}"
        )
    if problems:
        raise BadInputError("bad sampling settings: " + "; ".join(problems))
    return sampling


def sampling_dict(sampling: Sampling) -> dict[str, Any]:
    """The settings as plain data for results and history: only those that act.

    Example:
        >>> sampling_dict(Sampling())
        {'greedy': True}
    """
    data: dict[str, Any] = {"greedy": sampling.greedy}
    if not sampling.greedy:
        data |= {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "seed": sampling.seed,
        }
    if sampling.repetition_penalty != 1.0:
        data["repetition_penalty"] = sampling.repetition_penalty
    return data


def describe_sampling(settings: dict[str, Any]) -> str:
    """One line for people: ``"greedy"`` or ``"temperature 0.7, top-p 0.9, top-k 50, seed 1"``.

    Example:
        >>> describe_sampling({"greedy": True, "repetition_penalty": 1.2})
        'greedy, repetition penalty 1.2'
    """
    if not settings:
        return "greedy"
    parts = ["greedy"] if settings.get("greedy", True) else []
    if not settings.get("greedy", True):
        parts.append(f"temperature {settings.get('temperature', 1.0):g}")
        if settings.get("top_p", 1.0) < 1.0:
            parts.append(f"top-p {settings['top_p']:g}")
        if settings.get("top_k", 0):
            parts.append(f"top-k {settings['top_k']}")
        parts.append(f"seed {settings.get('seed', 0)}")
    if settings.get("repetition_penalty", 1.0) != 1.0:
        parts.append(f"repetition penalty {settings['repetition_penalty']:g}")
    return ", ".join(parts)


class TokenPicker:
    """Picks each next token for one generation run (one seeded generator per run)."""

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = check_sampling(sampling)
        self._generator = torch.Generator().manual_seed(int(sampling.seed))

    def pick(self, logits: torch.Tensor, seen_ids: Sequence[int]) -> int:
        """The next token id from the last position's ``logits`` ``(1, V)``; ``seen_ids`` are
        the prompt's and the generated tokens (for the repetition penalty)."""
        scores = logits[0].detach().to("cpu", torch.float32)  # (V,)
        s = self.sampling
        if s.repetition_penalty != 1.0 and seen_ids:
            ids = torch.tensor(sorted(set(seen_ids)), dtype=torch.long)
            ids = ids[ids < scores.numel()]
            picked = scores[ids]
            scores[ids] = torch.where(
                picked > 0, picked / s.repetition_penalty, picked * s.repetition_penalty
            )
        if s.greedy:
            return int(scores.argmax())
        scores = scores / s.temperature
        if 0 < s.top_k < scores.numel():
            kth = torch.topk(scores, s.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if s.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=True)
            cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
            # drop a token once the ones before it already reach top_p; the first always stays
            drop = cumulative - ordered.softmax(dim=-1) >= s.top_p
            scores[order[drop]] = float("-inf")
        probs = scores.softmax(dim=-1)
        return int(torch.multinomial(probs, 1, generator=self._generator))
