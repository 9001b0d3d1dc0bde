"""Constants under the reference's names (``accelerate.utils.constants``).

Example:
    >>> import torch
    >>> torch.nn.Linear in SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
    True
"""

from __future__ import annotations

from torch import nn

__all__ = ["SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING"]

SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING: tuple[type[nn.Module], ...] = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.Linear,
)
"""The layer classes that layerwise casting hooks (in the reference's order); other layers
(norms, embeddings) keep their dtype. ``attach_layerwise_casting_hooks`` reads this tuple."""
