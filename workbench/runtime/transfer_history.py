"""Transfer telemetry: the worker-side recorder of the engine's ``TransferEvent``s, per-layer
summaries, and the host-side bounded history the latency plots read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from workbench.big_modeling.transfers import TransferEvent
from workbench.runtime.protocol import LayerTiming, TransferBatch
from workbench.runtime.ring_buffer import RingBuffer

# ------------------------------------------------------------------------------------------


class TransferRecorder:
    """Collects the engine's ``TransferEvent``s; ``drain()`` returns them as one batch.

    Install with ``workbench.big_modeling.transfers.recording_transfers(recorder)``. Holds at
    most ``max_pending`` events between drains (the oldest are dropped and counted).
    """

    def __init__(self, max_pending: int = 100_000) -> None:
        self._pending: list[TransferEvent] = []
        self._lock = threading.Lock()
        self.max_pending = max_pending
        self.dropped = 0

    def __call__(self, event: TransferEvent) -> None:
        with self._lock:
            if len(self._pending) >= self.max_pending:
                self._pending.pop(0)
                self.dropped += 1
            self._pending.append(event)

    def drain(self, request_id: int, forward_index: int) -> TransferBatch:
        with self._lock:
            events, self._pending = tuple(self._pending), []
        return TransferBatch(request_id=request_id, forward_index=forward_index, events=events)


def summarize_layers(events: Iterable[TransferEvent]) -> tuple[LayerTiming, ...]:
    """Sum transfer and compute time and bytes per module, in first-seen order."""
    order: list[str] = []
    acc: dict[str, dict[str, object]] = {}
    for ev in events:
        row = acc.get(ev.module)
        if row is None:
            row = {"transfer_s": 0.0, "compute_s": 0.0, "nbytes": 0, "src": "", "dst": ""}
            acc[ev.module] = row
            order.append(ev.module)
        if ev.kind == "compute":
            row["compute_s"] = float(row["compute_s"]) + ev.duration_s  # type: ignore[arg-type]
        else:
            row["transfer_s"] = float(row["transfer_s"]) + ev.duration_s  # type: ignore[arg-type]
            row["nbytes"] = int(row["nbytes"]) + ev.nbytes  # type: ignore[call-overload]
            row["src"], row["dst"] = ev.source, ev.destination
    return tuple(
        LayerTiming(
            module=name,
            transfer_s=float(acc[name]["transfer_s"]),  # type: ignore[arg-type]
            compute_s=float(acc[name]["compute_s"]),  # type: ignore[arg-type]
            nbytes=int(acc[name]["nbytes"]),  # type: ignore[call-overload]
            source=str(acc[name]["src"]),
            destination=str(acc[name]["dst"]),
        )
        for name in order
    )


def group_layers(layers: Iterable[LayerTiming], prefixes: Iterable[str]) -> tuple[LayerTiming, ...]:
    """Sum per-module timings into the longest matching prefix (e.g. the device map's keys).

    Modules under no prefix keep their own row. Compute is summed from the modules' own rows
    only where the prefix itself reported none, so nested compute is not counted twice.

    Example:
        >>> rows = [LayerTiming("a.x", 1.0, 0.0, 10), LayerTiming("a.y", 1.0, 0.0, 30)]
        >>> group_layers(rows, ["a"])[0].nbytes
        40
    """
    keys = sorted(set(prefixes), key=len, reverse=True)
    order: list[str] = []
    acc: dict[str, list] = {}
    for layer in layers:
        owner = next(
            (k for k in keys if k in ("", layer.module) or layer.module.startswith(k + ".")),
            layer.module,
        )
        row = acc.get(owner)
        if row is None:
            row = acc[owner] = [0.0, 0.0, 0, "", "", 0.0]
            order.append(owner)
        row[0] += layer.transfer_s
        row[2] += layer.nbytes
        if layer.module == owner:
            row[5] = layer.compute_s  # the unit's own forward covers its children
        else:
            row[1] += layer.compute_s
        if layer.nbytes:
            row[3], row[4] = layer.source, layer.destination
    return tuple(
        LayerTiming(
            module=name,
            transfer_s=acc[name][0],
            compute_s=acc[name][5] or acc[name][1],
            nbytes=acc[name][2],
            source=acc[name][3],
            destination=acc[name][4],
        )
        for name in order
    )


TRANSFER_COLUMNS = (
    "forward_index",
    "module_id",
    "is_compute",
    "nbytes",
    "start_s",
    "duration_s",
    "gbps",
)


class TransferHistory:
    """The last ``capacity`` transfer/compute events (columns ``TRANSFER_COLUMNS``).

    Module names are interned to ids (``module_name(id)``); ``reset()`` (called by the host at
    every load) empties the events and the name table together, so the table is bounded by the
    modules of one model. ``last_forward()`` keeps the per-layer summary of the newest batch.
    """

    def __init__(self, capacity: int = 20_000) -> None:
        self.events = RingBuffer(capacity, width=len(TRANSFER_COLUMNS))
        self._ids: dict[str, int] = {}
        self._names: list[str] = []
        self._last: tuple[LayerTiming, ...] = ()
        self._last_index = -1
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Forget every event and module name (a new model is being loaded)."""
        with self._lock:
            self.events.clear()
            self._ids.clear()
            self._names.clear()
            self._last = ()
            self._last_index = -1

    def _module_id(self, name: str) -> int:
        ident = self._ids.get(name)
        if ident is None:
            ident = self._ids[name] = len(self._names)
            self._names.append(name)
        return ident

    def add(self, batch: TransferBatch) -> None:
        with self._lock:
            for ev in batch.events:
                self.events.append(
                    (
                        batch.forward_index,
                        self._module_id(ev.module),
                        1.0 if ev.kind == "compute" else 0.0,
                        ev.nbytes,
                        ev.start_s,
                        ev.duration_s,
                        ev.gbps,
                    )
                )
            if batch.events:
                self._last = summarize_layers(batch.events)
                self._last_index = batch.forward_index

    def module_name(self, module_id: int) -> str:
        with self._lock:
            return self._names[module_id]

    def module_names(self) -> list[str]:
        with self._lock:
            return list(self._names)

    def last_forward(self) -> tuple[LayerTiming, ...]:
        with self._lock:
            return self._last

    @property
    def last_forward_index(self) -> int:
        return self._last_index
