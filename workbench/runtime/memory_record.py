"""Predicted against measured memory per device: the record a load or an inference run carries.

The worker measures (``workbench.runtime.memory_reconcile``); this module only holds the figures
and says them in words, so the GUI imports it without torch. One ``DeviceMemory`` per device:

- predicted: the weights the device map places there (checkpoint header bytes) plus the
  reserve for the job's shape: for a run, the memory model's KV cache and activation peak at
  its real prompt and generated length, and on the device that runs offloaded blocks the
  largest one brought in for its forward; nothing for a load, which runs no forward;
- measured: what stays resident after a load, the peak during a run. CUDA: the allocator's
  ``memory_allocated`` after a load, ``max_memory_allocated`` during a run. CPU: the worker's
  anonymous RSS above what it held when the load started reading tensors (the interpreter,
  torch, transformers, the empty model and the tokenizer were there already), so the figure is
  the model's share, plus the weights memory-mapped from files (a zero-copy load); the whole
  RSS and its split into weights and the rest are kept too, and what the load added before
  its tensors (the runtime overhead), measured apart: no prediction covers it. Disk: the bytes of the offloaded weights in
  the offload folder, and the bytes read (from the checkpoint during a load, from the offload
  folder during a run).

Example:
    >>> row = DeviceMemory("cpu", predicted_weights_bytes=1000, measured_bytes=1100)
    >>> round(row.error_fraction, 3)
    -0.091
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from workbench.runtime.formatting import format_nbytes

__all__ = ["TABLE_COLUMNS", "DeviceMemory", "MemoryReconciliation", "format_error"]

#: The columns of the predicted-vs-measured table (GUI Inference tab, CLI text output).
TABLE_COLUMNS = (
    "device",
    "predicted weights",
    "measured weights",
    "predicted total",
    "measured",
    "error",
    "read from disk",
)


@dataclass(frozen=True)
class DeviceMemory:
    """One device's predicted and measured bytes after a load or a run.

    Attributes:
        device: ``"cuda:0"``, ``"cpu"`` or ``"disk"``.
        predicted_weights_bytes: header bytes of the map entries placed on the device.
        predicted_reserve_bytes: what a run needs there beyond the resident weights: KV cache
            plus activation peak (the memory model), plus the largest offloaded block on the
            device that runs it (0 for a load).
        measured_weights_bytes: parameter and persistent-buffer bytes resident there, each
            storage counted once (disk: the offloaded weights' files); ``None``: not measured.
        measured_bytes: the figure compared with the prediction (see the module docstring);
            ``None`` where it cannot be measured here.
        process_bytes: the whole measurement before the baseline is taken off: CPU, the
            worker's anonymous RSS at the end of the job; CUDA, ``memory_allocated`` at the end.
        baseline_bytes: CPU: the worker's anonymous RSS when the load started reading
            tensors (0 elsewhere).
        read_bytes: disk: bytes read during the job.
        how: the measurement in a few words (the GUI's tooltip, the CLI's note).
        mapped_weights_bytes: CPU: the part of the weights memory-mapped from files (a
            zero-copy load of the checkpoint): file pages, in ``measured_bytes`` but not in
            the anonymous RSS.
        runtime_bytes: CPU: the anonymous RSS the load added before its tensors started
            loading (imports, a GGUF conversion, the empty model, the tokenizer), measured
            apart: neither predicted nor in ``measured_bytes``; ``None`` elsewhere or when
            not measured.
    """

    device: str
    predicted_weights_bytes: int = 0
    predicted_reserve_bytes: int = 0
    measured_weights_bytes: int | None = None
    measured_bytes: int | None = None
    process_bytes: int | None = None
    baseline_bytes: int = 0
    read_bytes: int = 0
    how: str = ""
    mapped_weights_bytes: int = 0
    runtime_bytes: int | None = None

    @property
    def predicted_bytes(self) -> int:
        """Weights plus reserve: the prediction ``measured_bytes`` is compared with."""
        return self.predicted_weights_bytes + self.predicted_reserve_bytes

    @property
    def rest_bytes(self) -> int | None:
        """Measured minus measured weights: what the device holds besides the weights."""
        if self.measured_bytes is None or self.measured_weights_bytes is None:
            return None
        return self.measured_bytes - self.measured_weights_bytes

    @property
    def error_fraction(self) -> float | None:
        """``(predicted - measured) / measured``: +0.1 predicts 10% too much; ``None`` when
        nothing was measured (or zero bytes were)."""
        if not self.measured_bytes:
            return None
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes

    def describe_measured(self, when: str = "") -> str:
        """One line: ``"measured after the load: 2.82 MiB weights, 6.78 MiB in all (predicted
        2.82 MiB, -58.4%)"`` (``when``: ``"after the load"``); empty when nothing was
        measured."""
        parts = []
        if self.measured_weights_bytes is not None:
            parts.append(f"{format_nbytes(self.measured_weights_bytes)} weights")
        if self.measured_bytes is not None:
            parts.append(f"{format_nbytes(self.measured_bytes)} in all")
        if not parts:
            return ""
        against = f"predicted {format_nbytes(self.predicted_bytes)}"
        if self.error_fraction is not None:
            against += f", {format_error(self.error_fraction)}"
        head = f"measured {when}: " if when else "measured "
        return f"{head}{', '.join(parts)} ({against})"


@dataclass(frozen=True)
class MemoryReconciliation:
    """Predicted against measured memory for every device a job touched.

    Attributes:
        job: ``"load"`` or ``"infer"``.
        devices: one row per device, in device order (GPUs, cpu, disk).
        context_tokens: the tokens the run's reserve was predicted for (prompt + generated;
            0 for a load).
        notes: what the prediction could not cover, in words (e.g. a model the KV-cache model
            does not know).
    """

    job: str
    devices: tuple[DeviceMemory, ...] = ()
    context_tokens: int = 0
    notes: tuple[str, ...] = ()

    def __iter__(self) -> Iterator[DeviceMemory]:
        return iter(self.devices)

    def device(self, label: str) -> DeviceMemory | None:
        """The row of ``label`` (``"cpu"``, ``"cuda:0"``, ``"disk"``), or ``None``."""
        return next((row for row in self.devices if row.device == label), None)

    def as_json(self) -> dict[str, Any]:
        """Plain data for ``--json``: every field, and per device ``predicted_bytes`` and
        ``error_fraction`` (``null`` where nothing was measured)."""
        data = asdict(self)
        for row, device in zip(data["devices"], self.devices, strict=True):
            row["predicted_bytes"] = device.predicted_bytes
            row["error_fraction"] = device.error_fraction
        return data

    def table_lines(self) -> list[str]:
        """The table as aligned text lines, header first (the CLI's output)."""
        rows = [TABLE_COLUMNS, *self.table_rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_COLUMNS))]
        return [
            "  ".join(
                text.ljust(width) if column == 0 else text.rjust(width)
                for column, (text, width) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
            for row in rows
        ]

    def table_rows(self) -> list[tuple[str, ...]]:
        """One row of text per device, in ``TABLE_COLUMNS`` order ("-" for unmeasured)."""
        return [
            (
                row.device,
                format_nbytes(row.predicted_weights_bytes),
                _bytes_or_dash(row.measured_weights_bytes),
                format_nbytes(row.predicted_bytes),
                _bytes_or_dash(row.measured_bytes),
                format_error(row.error_fraction),
                format_nbytes(row.read_bytes) if row.read_bytes else "-",
            )
            for row in self.devices
        ]

    def describe(self) -> str:
        """One line for the log: ``"after load: cpu predicted 8.0 MiB, measured 8.4 MiB
        (-4.8%); disk predicted 24 MiB, measured 24 MiB (+0.0%), read 24 MiB"``."""
        what = "after load" if self.job == "load" else f"after {self.job}"
        if self.context_tokens:
            what += f" ({self.context_tokens} tokens)"
        parts = []
        for row in self.devices:
            text = f"{row.device} predicted {format_nbytes(row.predicted_bytes)}"
            if row.measured_bytes is not None:
                text += f", measured {format_nbytes(row.measured_bytes)}"
                text += f" ({format_error(row.error_fraction)})"
            if row.read_bytes:
                text += f", read {format_nbytes(row.read_bytes)}"
            parts.append(text)
        line = f"memory {what}: " + ("; ".join(parts) if parts else "no device measured")
        return line + "".join(f" [{note}]" for note in self.notes)


def format_error(fraction: float | None) -> str:
    """``+12.5%``, ``-3.0%``, ``-`` when there is nothing to compare.

    Example:
        >>> format_error(0.125), format_error(-0.03), format_error(None)
        ('+12.5%', '-3.0%', '-')
    """
    return "-" if fraction is None else f"{fraction * 100:+.1f}%"


def _bytes_or_dash(nbytes: int | None) -> str:
    return "-" if nbytes is None else format_nbytes(nbytes)
