"""What both verify modes share (``verify`` for a full CPU reference, ``verify_layers`` for
one unit at a time): the model's dtype, the forward's keyword arguments and the element-wise
comparison of an output with its reference."""

from __future__ import annotations

from typing import Any

import torch

from workbench.runtime.model_inputs import ModelInputs, accepts
from workbench.runtime.protocol import VerifyResult


def compare_outputs(
    actual: torch.Tensor, expected: torch.Tensor, *, atol: float = 0.0, rtol: float = 0.0
) -> VerifyResult:
    """Compare two outputs: max absolute difference, and that relative to ``max|expected|``.

    Example:
        >>> compare_outputs(torch.ones(2), torch.ones(2)).exact
        True
    """
    if actual.shape != expected.shape:
        raise ValueError(f"output shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    a = actual.detach().to("cpu", torch.float64)
    b = expected.detach().to("cpu", torch.float64)
    diff = (a - b).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    scale = float(b.abs().max()) if b.numel() else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    worst = (
        tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
        if diff.numel()
        else ()
    )
    finite = bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())
    passed = finite and bool((diff <= atol + rtol * b.abs()).all())
    return VerifyResult(
        passed=passed,
        max_abs_diff=max_abs,
        max_rel_diff=max_rel,
        exact=bool(torch.equal(actual.detach().cpu(), expected.detach().cpu())),
        reference="cpu (transformers from_pretrained, no dispatch)",
        output_shape=tuple(actual.shape),
        worst_position=worst,
    )


def forward_kwargs(model: torch.nn.Module, inputs: ModelInputs) -> dict[str, Any]:
    """``inputs`` as keyword arguments, with ``use_cache=False`` where the forward takes it."""
    kwargs: dict[str, Any] = dict(inputs.kwargs)
    if accepts(model, "use_cache"):
        kwargs["use_cache"] = False
    return kwargs
