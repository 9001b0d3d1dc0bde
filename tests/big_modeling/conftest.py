"""Small models built under empty init, shared by the engine tests.

Fixtures (function-scoped: each test gets a fresh model it may mutate):

- ``llama_config`` / ``tiny_llama``: a 2-layer Llama (hidden 64, GQA 4 heads / 2 KV heads,
  vocab 128, tied embeddings) as ``LlamaForCausalLM`` with meta weights.
- ``gpt2_config`` / ``tiny_gpt2``: a 2-layer GPT-2 (n_embd 32, 4 heads, vocab 96), tied.
- ``bert_config`` / ``tiny_bert``: a 2-layer BERT encoder (hidden 32, 4 heads, vocab 96).
- ``toy_model``: ``ToyModel`` below, plain torch, byte sizes small enough to plan by hand.

All transformers models come from ``AutoModel*.from_config`` under ``init_empty_weights``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench.big_modeling.empty_init import init_empty_weights


class ToyBlock(nn.Module):
    """Two ``Linear(4, 4)``: 2 x (16 + 4) x 4 B = 160 B in float32."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(4, 4)
        self.linear2 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.linear2(torch.relu(self.linear1(x)))


class ToyModel(nn.Module):
    """embed (80 B), blocks.0-2 (160 B each), head Linear(4, 2) (40 B): 600 B in float32."""

    def __init__(self, num_blocks: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 4)
        self.blocks = nn.ModuleList(ToyBlock() for _ in range(num_blocks))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.fixture
def toy_model() -> ToyModel:
    """A real (CPU, seeded) ``ToyModel`` of 600 B."""
    torch.manual_seed(0)
    return ToyModel()


@pytest.fixture
def llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )


@pytest.fixture
def tiny_llama(llama_config) -> nn.Module:
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        return AutoModelForCausalLM.from_config(llama_config)


@pytest.fixture
def gpt2_config():
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=96,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )


@pytest.fixture
def tiny_gpt2(gpt2_config) -> nn.Module:
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        return AutoModelForCausalLM.from_config(gpt2_config)


@pytest.fixture
def bert_config():
    from transformers import BertConfig

    return BertConfig(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )


@pytest.fixture
def tiny_bert(bert_config) -> nn.Module:
    from transformers import AutoModel

    with init_empty_weights():
        return AutoModel.from_config(bert_config)
