"""Verify a quantized model against its full-precision reference: top-1 agreement and logit gap.

A quantized load cannot be bitwise identical to the reference, so ``verify`` for an unquantized
map ("bitwise identical") becomes, for a precision map, two numbers a reader can judge: over a
fixed prompt set, at every position, does the quantized model predict the same next token as the
full-precision one (top-1 agreement), and how far apart are the logits (max and mean
``|dlogit|``). The prompts are fixed (texts when a tokenizer exists, seeded token ids otherwise),
so two runs of the same models give the same figures.

Example:
    >>> result = compare_quantized(quantized, reference, prompt_ids(None, 774))  # doctest: +SKIP
    >>> result.describe()  # doctest: +SKIP
    'top-1 agreement 96% (31/32), max |dlogit| 0.41, mean |dlogit| 0.052'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.big_modeling.errors import BadInputError
from workbench.runtime.protocol import VerifyResult

FIXED_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Water boils at one hundred degrees Celsius at sea level because",
    "In 1969, the first humans to walk on the Moon were",
    "To make a cup of tea, first boil the water, then",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "Memory bandwidth limits decode speed: every generated token reads",
    "1, 2, 3, 5, 8, 13, 21,",
)
"""The fixed prompt set (texts) used when the model has a tokenizer."""

PROMPT_SEED = 1234
SYNTHETIC_PROMPTS = 8
SYNTHETIC_TOKENS = 16


@dataclass(frozen=True)
class QuantizedAgreement:
    """How a quantized model's next-token logits compare with the full-precision model's.

    Attributes:
        positions: next-token predictions compared (every position of every prompt).
        agreed: positions where both models' argmax token is the same.
        max_abs_logit_diff: the largest ``|logit - reference logit|`` over all positions/tokens.
        mean_abs_logit_diff: the mean of ``|logit - reference logit|``.
        bitwise_identical: the logits are equal bit for bit (an unquantized map on CPU).
    """

    positions: int
    agreed: int
    max_abs_logit_diff: float
    mean_abs_logit_diff: float
    bitwise_identical: bool

    @property
    def agreement(self) -> float:
        """``agreed / positions`` (1.0 for no positions)."""
        return self.agreed / self.positions if self.positions else 1.0

    def describe(self) -> str:
        """One line for the Inference tab and the CLI.

        Example:
            >>> QuantizedAgreement(32, 31, 0.41, 0.052, False).describe()
            'top-1 agreement 96% (31/32), max |dlogit| 0.41, mean |dlogit| 0.052'
        """
        # floor, so 219/220 never reads as 100%
        if self.bitwise_identical:
            return f"bitwise identical ({self.positions} positions)"
        percent = int(100 * self.agreed / self.positions) if self.positions else 100
        return (
            f"top-1 agreement {percent}% ({self.agreed}/{self.positions}), "
            f"max |dlogit| {self.max_abs_logit_diff:.2g}, "
            f"mean |dlogit| {self.mean_abs_logit_diff:.2g}"
        )


def prompt_ids(tokenizer: Any, vocab_size: int) -> list[torch.Tensor]:
    """The fixed prompt set as ``(1, T)`` id tensors.

    Args:
        tokenizer: a ``transformers`` tokenizer, or ``None`` for seeded random ids
            (``SYNTHETIC_PROMPTS`` prompts of ``SYNTHETIC_TOKENS`` tokens, seed ``PROMPT_SEED``).
        vocab_size: the model's vocabulary size (bounds the synthetic ids).

    Raises:
        BadInputError: ``vocab_size`` < 1.

    Example:
        >>> [tuple(ids.shape) for ids in prompt_ids(None, 100)][:2]
        [(1, 16), (1, 16)]
    """
    if vocab_size < 1:
        raise BadInputError(f"vocab_size must be at least 1, got {vocab_size}")
    if tokenizer is not None:
        return [tokenizer(text, return_tensors="pt").input_ids for text in FIXED_PROMPTS]
    generator = torch.Generator().manual_seed(PROMPT_SEED)
    return [
        torch.randint(0, vocab_size, (1, SYNTHETIC_TOKENS), generator=generator)
        for _ in range(SYNTHETIC_PROMPTS)
    ]


def _logits(model: torch.nn.Module, ids: torch.Tensor, device: torch.device) -> torch.Tensor:
    output = model(input_ids=ids.to(device), use_cache=False)
    logits = getattr(output, "logits", output)
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"cannot find logits in {type(output).__name__}")
    return logits.detach().to("cpu", torch.float32)  # (1, T, V)


def compare_quantized(
    model: torch.nn.Module,
    reference: torch.nn.Module,
    prompts: Sequence[torch.Tensor],
    *,
    device: str | torch.device = "cpu",
    reference_device: str | torch.device = "cpu",
) -> QuantizedAgreement:
    """Compare next-token logits of ``model`` (quantized, dispatched) and ``reference``.

    Args:
        model: the quantized model (its hooks move inputs where they must go).
        reference: the same checkpoint loaded at full precision, undispatched.
        prompts: ``(1, T)`` id tensors (``prompt_ids``).
        device: where ``model``'s inputs start (its execution device).
        reference_device: where ``reference`` runs.

    Returns:
        A ``QuantizedAgreement`` over every position of every prompt.

    Raises:
        BadInputError: no prompts, or the two models' logits differ in shape.

    Example:
        >>> compare_quantized(model, reference, prompt_ids(None, 774)).agreement  # doctest: +SKIP
        0.96875
    """
    if not prompts:
        raise BadInputError("compare_quantized needs at least one prompt")
    positions = agreed = 0
    max_diff, diff_sum, diff_count = 0.0, 0.0, 0
    identical = True
    with torch.inference_mode():
        for ids in prompts:
            actual = _logits(model, ids, torch.device(device))
            expected = _logits(reference, ids, torch.device(reference_device))
            if actual.shape != expected.shape:
                raise BadInputError(
                    f"logits of the quantized model are {tuple(actual.shape)} but the "
                    f"reference's are {tuple(expected.shape)}; compare the same checkpoint"
                )
            identical = identical and torch.equal(actual, expected)
            diff = (actual - expected).abs()
            max_diff = max(max_diff, float(diff.max()))
            diff_sum += float(diff.double().sum())
            diff_count += diff.numel()
            agreed += int((actual.argmax(-1) == expected.argmax(-1)).sum())
            positions += actual.shape[0] * actual.shape[1]
    return QuantizedAgreement(
        positions=positions,
        agreed=agreed,
        max_abs_logit_diff=max_diff,
        mean_abs_logit_diff=diff_sum / diff_count if diff_count else 0.0,
        bitwise_identical=identical,
    )


QUANTIZED_PASS_AGREEMENT = 0.9
"""A quantized verify passes when at least this share of next tokens agree (a judgement call:
int8 on a trained model agrees on well over 90%; int4 on random demo weights does not)."""


def is_quantized_load(loaded: Any) -> bool:
    """Whether a loaded model's request asked for a precision map (``--quantize`` too)."""
    options = getattr(loaded.request, "options", {}) or {}
    return bool(options.get("precision_map") or options.get("quantize"))


def quantized_verify_result(
    loaded: Any, reference: torch.nn.Module, device: str | torch.device
) -> VerifyResult:
    """``verify``'s result for a quantized load: top-1 agreement and the logit gap.

    Args:
        loaded: the worker's loaded model (model, tokenizer).
        reference: the full-precision CPU reference (``verify.build_reference``).
        device: the dispatched model's execution device.
    """
    vocab = int(getattr(getattr(loaded.model, "config", None), "vocab_size", 0) or 0)
    prompts = prompt_ids(loaded.tokenizer, vocab)
    agreement = compare_quantized(loaded.model, reference, prompts, device=device)
    return VerifyResult(
        passed=agreement.agreement >= QUANTIZED_PASS_AGREEMENT,
        max_abs_diff=agreement.max_abs_logit_diff,
        max_rel_diff=0.0,
        exact=agreement.bitwise_identical,
        reference="cpu full precision (transformers from_pretrained, no dispatch, no quantization)",
        output_shape=(),
        top1_positions=agreement.positions,
        top1_agreed=agreement.agreed,
        mean_abs_diff=agreement.mean_abs_logit_diff,
    )
