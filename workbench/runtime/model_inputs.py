"""The input of an inference test or a verify: token ids for text models, synthetic tensors else.

Text models get the tokenized prompt (or seeded random ids). Models whose forward takes no
``input_ids`` get a seeded random input of the shape their config declares: ``pixel_values``
``(1, num_channels, image_size, image_size)`` for vision models, ``input_features`` for speech
encoders (Whisper-style ``(1, num_mel_bins, frames)`` or Speech2Text-style
``(1, frames, features)``), ``input_values`` ``(1, samples)`` for raw-audio models.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any

import torch

from workbench.big_modeling.errors import BadInputError

logger = logging.getLogger(__name__)

SYNTHETIC_SEED = 0
AUDIO_SAMPLES = 16_000  # one second at 16 kHz
SPEECH_FRAMES = 64


@dataclass(frozen=True)
class ModelInputs:
    """Keyword arguments of one forward. ``tokens`` is the prompt length for text models and 0
    for synthetic non-text inputs; ``text`` is False for those."""

    kwargs: dict[str, torch.Tensor]
    tokens: int
    text: bool

    @property
    def main(self) -> torch.Tensor:
        """The input tensor itself (the first keyword)."""
        return next(iter(self.kwargs.values()))

    def to(self, device: torch.device) -> ModelInputs:
        moved = {key: value.to(device) for key, value in self.kwargs.items()}
        return ModelInputs(moved, self.tokens, self.text)


def forward_parameters(model: torch.nn.Module) -> list[str]:
    """The names of ``model.forward``'s parameters (empty when they cannot be read)."""
    try:
        return list(inspect.signature(type(model).forward).parameters)
    except (TypeError, ValueError):
        return []


def accepts(model: torch.nn.Module, name: str) -> bool:
    """True when ``model.forward`` takes a parameter called ``name``."""
    return name in forward_parameters(model)


def prepare_input_ids(loaded: Any, prompt: str | None, synthetic_tokens: int) -> torch.Tensor:
    """Tokenize ``prompt`` with the model's tokenizer, or make seeded random ids. Shape (1, T).

    A prompt given to a model without a tokenizer is not silently dropped: a warning says so.
    """
    tokenizer = loaded.tokenizer
    if prompt and tokenizer is not None:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        if ids.shape[-1] > 0:
            return ids.to(torch.long)
    if prompt and tokenizer is None:
        logger.warning(
            "the prompt is ignored: %s has no tokenizer; using %d seeded random token ids",
            getattr(loaded.opened, "source", "the model"),
            max(1, int(synthetic_tokens)),
        )
    config = getattr(loaded.model, "config", None)
    vocab = int(getattr(config, "vocab_size", 0) or 1000)
    count = max(1, int(synthetic_tokens))
    generator = torch.Generator().manual_seed(SYNTHETIC_SEED)
    return torch.randint(0, vocab, (1, count), generator=generator, dtype=torch.long)


def prepare_inputs(loaded: Any, prompt: str | None, synthetic_tokens: int) -> ModelInputs:
    """The forward's input for ``loaded.model``: token ids, or a synthetic tensor of the shape
    its config declares (see the module docs).

    Raises:
        BadInputError: for a forward that takes none of the inputs we know how to make.
    """
    model = loaded.model
    params = forward_parameters(model)
    if "input_ids" in params or not params:
        ids = prepare_input_ids(loaded, prompt, synthetic_tokens)
        return ModelInputs({"input_ids": ids}, int(ids.shape[-1]), True)
    if prompt:
        logger.warning(
            "the prompt is ignored: %s takes no text; using a synthetic input",
            type(model).__name__,
        )
    config = getattr(model, "config", None)
    dtype = model_dtype(model)
    for name in ("pixel_values", "input_features", "input_values"):
        if name in params:
            shape = synthetic_shape(name, config)
            generator = torch.Generator().manual_seed(SYNTHETIC_SEED)
            value = torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype)
            return ModelInputs({name: value}, 0, False)
    raise BadInputError(
        f"{type(model).__name__}: cannot make an input for its forward "
        f"({', '.join(p for p in params if p != 'self')}); inference tests support "
        "input_ids, pixel_values, input_features and input_values"
    )


def learned_position_limit(model: torch.nn.Module) -> int | None:
    """The positions a model's learned position embedding has (GPT-2's ``wpe``, BERT's
    ``position_embeddings``): an ``nn.Embedding`` other than its input embedding with
    ``max_position_embeddings`` rows. ``None`` for rotary and other computed positions, which
    run past the configured length (less well) where a learned table has no row to look up."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not isinstance(limit, int) or limit <= 0:
        return None
    words = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    for module in model.modules():
        if (
            isinstance(module, torch.nn.Embedding)
            and module is not words
            and module.num_embeddings == limit
        ):
            return limit
    return None


def check_positions(loaded: Any, prompt_tokens: int, new_tokens: int = 0) -> None:
    """Refuse a run whose prompt and generated tokens need more positions than the model's
    learned position embedding has (``learned_position_limit``): its forward would fail deep
    in the model with "index out of range in self".

    Raises:
        BadInputError: naming the model, both counts and the limit.
    """
    limit = learned_position_limit(loaded.model)
    needed = prompt_tokens + max(new_tokens - 1, 0)  # the last token is never fed back
    if limit is None or needed <= limit:
        return
    what = getattr(getattr(loaded, "opened", None), "source", None) or type(loaded.model).__name__
    asked = f"the prompt's {prompt_tokens} tokens"
    if new_tokens:
        asked += f" and {new_tokens} new ones"
    raise BadInputError(
        f"{what}: {asked} need {needed} positions, but the model has learned position "
        f"embeddings for {limit} (max_position_embeddings); shorten the prompt"
        + (" or ask for fewer new tokens" if new_tokens else "")
    )


def synthetic_shape(name: str, config: Any) -> tuple[int, ...]:
    """The shape of a one-sample synthetic ``name`` input for a model with ``config``.

    Example:
        >>> from types import SimpleNamespace
        >>> synthetic_shape("pixel_values", SimpleNamespace(num_channels=3, image_size=32))
        (1, 3, 32, 32)
    """
    if name == "pixel_values":
        channels = int(getattr(config, "num_channels", 3) or 3)
        height, width = _pair(getattr(config, "image_size", 224) or 224)
        return (1, channels, height, width)
    if name == "input_features":
        mel_bins = getattr(config, "num_mel_bins", None)
        if mel_bins:  # Whisper: the encoder expects exactly 2 * max_source_positions frames
            frames = 2 * int(getattr(config, "max_source_positions", SPEECH_FRAMES // 2))
            return (1, int(mel_bins), frames)
        features = int(getattr(config, "input_feat_per_channel", 80) or 80)
        channels = int(getattr(config, "input_channels", 1) or 1)
        return (1, SPEECH_FRAMES, features * channels)
    if name == "input_values":
        return (1, AUDIO_SAMPLES)
    raise ValueError(f"no synthetic shape for {name!r}")


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[-1])
    return int(value), int(value)


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The floating dtype of the model's parameters (offloaded ones keep their dtype on meta)."""
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.float32
