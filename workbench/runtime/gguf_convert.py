"""The "Convert for loading" job: a GGUF file becomes a folder the load job can dispatch.

``iter_conversion`` runs ``workbench.models.gguf_convert.convert_gguf`` on a thread and yields
its ``ConvertProgress`` reports (throttled to ~20 Hz; stage changes and the last report of a
stage always pass), then one ``ConversionDone`` with the folder. A failure is raised from the
generator; closing the generator or setting the token cancels the conversion, which leaves no
partial folder. The GUI and the CLI drive the same generator.

Example:
    >>> token = CancelToken()
    >>> for event in iter_conversion("model.gguf", token):  # doctest: +SKIP
    ...     print(event)
    ConvertProgress(stage='hashing file', done=0, total=0)
    ...
    ConversionDone(folder=PosixPath('.../gguf/model-1f2e3d4c5b6a7980'))
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from workbench.big_modeling.progress import CancelToken
from workbench.models.gguf_convert import CONVERT_STAGES, ConvertProgress, convert_gguf

__all__ = [
    "CONVERT_STAGES",
    "CancelToken",
    "ConversionDone",
    "ConvertProgress",
    "iter_conversion",
]

PROGRESS_INTERVAL_S = 0.05  # ~20 Hz
_THREAD_NAME = "convert gguf"


@dataclass(frozen=True)
class ConversionDone:
    """The last event of a conversion: the converted (or already cached) folder."""

    folder: Path


def iter_conversion(
    path: str | os.PathLike[str],
    token: CancelToken,
    *,
    cache_root: str | os.PathLike[str] | None = None,
    interval_s: float = PROGRESS_INTERVAL_S,
) -> Iterator[ConvertProgress | ConversionDone]:
    """Convert ``path`` on a worker thread, yielding its progress, then ``ConversionDone``.

    Args:
        path: the ``.gguf`` file.
        token: cancels the conversion when set (``LoadCancelled`` is then raised here).
        cache_root: where converted folders live (default: the workbench cache).
        interval_s: the shortest time between two progress events of one stage.

    Raises:
        ModelSourceError: the file cannot be converted (named, with the reason).
        LoadCancelled: the token was set.
    """
    events: queue.Queue[tuple[str, object]] = queue.Queue()

    def work() -> None:
        try:
            folder = convert_gguf(
                path,
                cache_root=cache_root,
                progress=lambda report: events.put(("progress", report)),
                cancel=token,
            )
        except BaseException as exc:
            events.put(("failed", exc))
        else:
            events.put(("done", folder))

    worker = threading.Thread(target=work, name=_THREAD_NAME, daemon=True)
    worker.start()
    last_sent = 0.0
    last_stage = ""
    pending: ConvertProgress | None = None
    finished = False
    try:
        while True:
            kind, payload = events.get()
            if kind == "progress":
                assert isinstance(payload, ConvertProgress)
                now = time.monotonic()
                stage_ends = payload.total and payload.done == payload.total
                if payload.stage != last_stage or stage_ends or now - last_sent >= interval_s:
                    if pending is not None and pending.stage != payload.stage:
                        yield pending  # the last report of the previous stage
                    pending = None
                    last_stage, last_sent = payload.stage, now
                    yield payload
                else:
                    pending = payload
                continue
            finished = True
            if kind == "failed":
                assert isinstance(payload, BaseException)
                raise payload
            assert isinstance(payload, Path)
            yield ConversionDone(payload)
            return
    finally:
        if not finished:
            token.cancel()  # the generator was closed early: stop the conversion
        worker.join()
