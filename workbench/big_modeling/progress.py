"""Progress reports and cooperative cancellation for long engine work (loading, offloading).

The engine calls a ``ProgressCallback`` with a ``LoadProgress`` and checks a ``CancelToken``
between tensors. The runtime plugs the worker's event stream into both; the CLI plugs tqdm.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from workbench.big_modeling.errors import LoadCancelled


@dataclass(frozen=True)
class LoadProgress:
    """One progress report. ``phase`` is ``"building"``, ``"loading"``, ``"quantizing"`` or
    ``"dispatching"``."""

    bytes_done: int
    bytes_total: int
    tensor_name: str = ""
    phase: str = "loading"

    @property
    def fraction(self) -> float:
        return 1.0 if self.bytes_total <= 0 else min(1.0, self.bytes_done / self.bytes_total)


ProgressCallback = Callable[[LoadProgress], None]


class CancelToken:
    """A thread-safe flag the engine checks between tensors.

    Example:
        >>> token = CancelToken()
        >>> token.cancel()
        >>> token.cancelled
        True
    """

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until ``cancel()`` is called or ``timeout_s`` passes; return ``cancelled``."""
        return self._event.wait(timeout_s)

    def raise_if_cancelled(self) -> None:
        """Raise ``LoadCancelled`` when ``cancel()`` has been called."""
        if self._event.is_set():
            raise LoadCancelled("cancelled by the user")
