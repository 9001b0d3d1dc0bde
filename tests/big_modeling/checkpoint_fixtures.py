"""Small seeded models and real checkpoints for the loading tests (session fixtures)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.big_modeling.loading.writer import save_sharded_checkpoint

HIDDEN = 8
VOCAB = 16


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, 2 * hidden)
        self.bn = nn.BatchNorm1d(2 * hidden)
        self.down = nn.Linear(2 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H)
        h = self.up(x)
        h = self.bn(h.reshape(-1, h.shape[-1])).reshape(h.shape)
        return x + self.down(torch.relu(h))


class TinyNet(nn.Module):
    """Embedding tied to the head, BatchNorm buffers, an int buffer, a non-persistent buffer."""

    def __init__(self, hidden: int = HIDDEN, vocab: int = VOCAB, layers: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("position_ids", torch.arange(4), persistent=True)
        self.register_buffer("scratch", torch.zeros(2), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_reference(seed: int = 0, dtype: torch.dtype = torch.float32) -> TinyNet:
    """A seeded TinyNet with trained-looking BatchNorm statistics, in eval mode."""
    torch.manual_seed(seed)
    model = TinyNet()
    with torch.no_grad():
        for block in model.blocks:
            block.bn.running_mean.uniform_(-1, 1)
            block.bn.running_var.uniform_(0.5, 2)
            block.bn.num_batches_tracked.fill_(7)
    return model.to(dtype).eval()


def state_without_tie_copy(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict storing only one of the tied pair (``embed.weight``), as HF does."""
    state = dict(model.state_dict())
    state.pop("head.weight")
    return state


def write_safetensors_raw(
    path: Path, header: dict, data: bytes, header_len: int | None = None
) -> Path:
    """Write a safetensors file by hand (for corrupt-file tests)."""
    raw = json.dumps(header).encode()
    length = len(raw) if header_len is None else header_len
    path.write_bytes(struct.pack("<Q", length) + raw + data)
    return path


@pytest.fixture(scope="session")
def reference_model() -> TinyNet:
    return make_reference()


@pytest.fixture(scope="session")
def sharded_ckpt(tmp_path_factory: pytest.TempPathFactory, reference_model: TinyNet) -> Path:
    """A 3-shard fp32 checkpoint folder of ``reference_model`` (tie stored once)."""
    folder = tmp_path_factory.mktemp("sharded")
    save_sharded_checkpoint(state_without_tie_copy(reference_model), folder, num_shards=3)
    return folder


@pytest.fixture(scope="session")
def single_ckpt(tmp_path_factory: pytest.TempPathFactory, reference_model: TinyNet) -> Path:
    """A folder with one ``model.safetensors`` (fp32)."""
    folder = tmp_path_factory.mktemp("single")
    save_sharded_checkpoint(state_without_tie_copy(reference_model), folder, num_shards=1)
    return folder


@pytest.fixture(scope="session")
def fp16_ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[TinyNet, Path]:
    """A 2-shard fp16 checkpoint and its (fp16) reference model."""
    model = make_reference(seed=1, dtype=torch.float16)
    folder = tmp_path_factory.mktemp("fp16")
    save_sharded_checkpoint(state_without_tie_copy(model), folder, num_shards=2)
    return model, folder


def empty_model(dtype: torch.dtype = torch.float32) -> TinyNet:
    """A TinyNet on meta (buffers real, as init_empty_weights leaves them)."""
    from workbench.big_modeling.empty_init import init_empty_weights

    with init_empty_weights():
        model = TinyNet()
    return model.to(dtype)
