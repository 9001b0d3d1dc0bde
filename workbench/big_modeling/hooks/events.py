"""Transfer events of the device hooks: what was materialised, from where, in how long.

Only called when a recorder is installed (``transfers._recorder is not None``), so nothing
here is on the hot path.

Example:
    >>> from workbench.big_modeling.transfers import recording_transfers
    >>> events = []
    >>> with recording_transfers(events.append):
    ...     pass
"""

from __future__ import annotations

import time
from typing import Any

import torch

from workbench.big_modeling import transfers as _transfers
from workbench.big_modeling.devices import device_label


def report_onload(
    recorder: _transfers.TransferRecorder, hook: Any, start_s: float, start_event: Any
) -> None:
    """Report one ``TransferEvent`` per source ("cpu", "disk") of ``hook``'s offloaded slots.

    Its bytes are what the slots read where they are stored (``TensorSlot.nbytes``): a
    quantized disk weight counts its packed tensors, not its placeholder's dtype x shape.

    Args:
        recorder: the installed recorder.
        hook: the ``AlignDevicesHook`` that just materialised its weights.
        start_s: ``time.perf_counter()`` when it started.
        start_event: a CUDA timing event recorded at the start (CUDA devices), else None; the
            duration is then measured on the GPU and placed after ``start_s``.
    """
    device = hook.device
    if start_event is not None:
        end_event = torch.cuda.Event(enable_timing=True)
        end_event.record(torch.cuda.current_stream(device))  # the stream start_event is on
        end_event.synchronize()
        end_s = start_s + start_event.elapsed_time(end_event) / 1e3  # ms on the GPU clock
    else:
        end_s = time.perf_counter()
    destination = "" if device is None else device_label(device)
    by_source: dict[str, int] = {}
    for slot in hook.slots:
        by_source[slot.source] = by_source.get(slot.source, 0) + slot.nbytes
    for source, nbytes in sorted(by_source.items()):
        recorder(
            _transfers.TransferEvent(hook.module_name, nbytes, source, destination, start_s, end_s)
        )
