"""Reusable compute-dtype buffers for the up-cast copies of layerwise casting on CPU.

A fresh 4096x4096 bf16 copy is 32 MiB that the CPU allocator takes from the OS and page-faults
in on every forward (~25 ms, as long as the up-cast itself with the fast kernel); copying into
a buffer kept from the previous layer of the same shape skips that.

Sharing one buffer between layers is safe only when nothing holds on to a copy after the layer's
forward returns, so ``LayerwiseCastingHook`` uses a pool only:

- on CPU: on CUDA the caching allocator already recycles the block, and it knows about streams;
- with autograd off (``torch.no_grad`` / ``torch.inference_mode``): otherwise the graph saves
  the copy for the backward (e.g. a frozen weight's copy, to compute the input's gradient);
- for layers whose ``forward`` is a stock ``Linear``/``Conv*`` one, whose output never aliases
  the weight (``attach_layerwise_casting_hooks`` decides; a hook built by hand gets no pool).

Re-entrant and concurrent forwards are safe: a buffer belongs to one forward from ``take`` to
``give_back``, and a forward that finds no free buffer of its layout allocates one. The pool
keeps, per layout, as many buffers as were ever in use at once (one for sequential layers);
they are freed with the pool, i.e. with the hooks that share it.
"""

from __future__ import annotations

import torch

_Layout = tuple[torch.device, torch.dtype, torch.Size, tuple[int, ...]]


class ScratchPool:
    """Free compute-dtype buffers, by the layout of the storage tensor they copy.

    Example:
        >>> import torch
        >>> pool = ScratchPool()
        >>> stored = torch.zeros(2, 3, dtype=torch.float8_e4m3fn)
        >>> first = pool.take(stored, torch.bfloat16)
        >>> pool.give_back(stored, first)
        >>> pool.take(stored, torch.bfloat16) is first
        True
    """

    def __init__(self) -> None:
        self._free: dict[_Layout, list[torch.Tensor]] = {}

    def take(self, stored: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A ``dtype`` buffer shaped and strided like ``stored`` (contents undefined)."""
        free = self._free.get(_layout(stored, dtype))
        if free:
            try:
                return free.pop()  # atomic under the GIL: two threads never get the same one
            except IndexError:
                pass
        return torch.empty_like(stored, dtype=dtype)

    def give_back(self, stored: torch.Tensor, buffer: torch.Tensor) -> None:
        """Return a buffer taken for ``stored``; it may be handed out again at once."""
        self._free.setdefault(_layout(stored, buffer.dtype), []).append(buffer)

    def nbytes(self) -> int:
        """Bytes held by the free buffers."""
        return sum(t.numel() * t.element_size() for free in self._free.values() for t in free)


def _layout(stored: torch.Tensor, dtype: torch.dtype) -> _Layout:
    return (stored.device, dtype, stored.shape, stored.stride())
