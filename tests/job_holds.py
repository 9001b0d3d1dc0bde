"""A load observer that parks a load at a known point, so a test can cancel or kill it there.

The worker imports it by name: give ``WorkerHost(load_observer=HOLD_OBSERVER)`` (or
``WorkerBridge(load_observer=HOLD_OBSERVER)``) and send the load with ``hold_options(n)``. The
worker process starts with its host's ``sys.path``; pytest puts this folder (``tests/``) on it,
and a script puts it there itself before it starts a worker.

After ``n`` tensors the load flushes its progress, sends ``Phase("held")`` and waits for its
cancel token (or, with ``ignore_cancel``, for nothing: the host must terminate the worker).
The wait ends after ``HOLD_LIMIT_S`` anyway, so a forgotten test never hangs a worker for good.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from workbench.runtime.jobs import ObservedLoad
from workbench.runtime.protocol import Phase

logger = logging.getLogger(__name__)

HOLD_OBSERVER = "job_holds:hold"  # the ``module:function`` the worker imports
HOLD_LIMIT_S = 120.0
AFTER_TENSORS = "hold_after_tensors"
IGNORE_CANCEL = "ignore_cancel"


def hold_options(after_tensors: int, *, ignore_cancel: bool = False) -> dict[str, Any]:
    """``Load.options`` that park the load after ``after_tensors`` tensors."""
    return {AFTER_TENSORS: int(after_tensors), IGNORE_CANCEL: ignore_cancel}


def hold(load: ObservedLoad) -> Callable[[int], None] | None:
    """The load observer: a hold when the load's options ask for one, else nothing."""
    after = load.request.options.get(AFTER_TENSORS)
    if after is None:
        return None
    ignore_cancel = bool(load.request.options.get(IGNORE_CANCEL))
    held = threading.Event()

    def on_tensor(tensors_seen: int) -> None:
        if held.is_set() or tensors_seen < int(after):
            return
        held.set()
        load.flush_progress()  # the host sees how far the load got, not the last throttled report
        load.emit(Phase(load.request.request_id, "held"))
        wait = threading.Event().wait if ignore_cancel else load.token.wait
        if not wait(HOLD_LIMIT_S):
            logger.warning("test hold released after %.0f s without a cancel", HOLD_LIMIT_S)

    return on_tensor
