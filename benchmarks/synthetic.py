"""Synthetic models for benchmarks: huge module trees that cost nothing to build.

``build_moe()`` makes a mixture-of-experts stack of 48 layers x 512 experts x 3 ``nn.Linear``
(gate, up, down) under ``init_empty_weights`` — 98,453 modules, the tree size on which
Accelerate's planner takes seconds.

Run directly to print the module count::

    python benchmarks/synthetic.py
"""

from __future__ import annotations

import time

from torch import nn

from workbench.big_modeling.empty_init import init_empty_weights


class Expert(nn.Module):
    """A SwiGLU feed-forward expert: gate, up and down projections."""

    def __init__(self, hidden_size: int, expert_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, expert_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, expert_size, bias=False)
        self.down_proj = nn.Linear(expert_size, hidden_size, bias=False)


class MoELayer(nn.Module):
    """One decoder layer's sparse MLP: a router and ``num_experts`` experts."""

    def __init__(self, hidden_size: int, expert_size: int, num_experts: int) -> None:
        super().__init__()
        self.router = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden_size, expert_size) for _ in range(num_experts))


class SyntheticMoE(nn.Module):
    """Embedding, ``num_layers`` MoE layers, a final norm and an LM head."""

    def __init__(
        self,
        num_layers: int = 48,
        num_experts: int = 512,
        hidden_size: int = 64,
        expert_size: int = 32,
        vocab_size: int = 1000,
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, hidden_size)
        self.layers = nn.ModuleList(
            MoELayer(hidden_size, expert_size, num_experts) for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(hidden_size)
        self.lm_head = nn.Linear(hidden_size, vocab_size, bias=False)


def build_moe(
    num_layers: int = 48,
    num_experts: int = 512,
    hidden_size: int = 64,
    expert_size: int = 32,
    vocab_size: int = 1000,
) -> SyntheticMoE:
    """Build the synthetic MoE with meta weights (no RAM for weights).

    Args:
        num_layers: decoder layers (``MoELayer``).
        num_experts: experts per layer, each with 3 ``nn.Linear``.
        hidden_size: model width.
        expert_size: expert inner width.
        vocab_size: embedding rows.

    Returns:
        The model; with defaults it has 48 * (3 + 512 * 4) + 5 = 98,453 modules (per layer:
        the layer, its router and expert list, and 512 experts of 4 modules each).

    Example:
        >>> model = build_moe(num_layers=2, num_experts=4)
        >>> sum(1 for _ in model.modules())  # 2 * (3 + 4 * 4) + 5
        43
    """
    with init_empty_weights():
        return SyntheticMoE(num_layers, num_experts, hidden_size, expert_size, vocab_size)


if __name__ == "__main__":
    start_s = time.perf_counter()
    model = build_moe()
    build_s = time.perf_counter() - start_s
    num_modules = sum(1 for _ in model.modules())
    print(f"synthetic MoE: {num_modules:,} modules built in {build_s:.2f} s")
