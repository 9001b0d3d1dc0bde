"""Measure what a load or an inference run really used per device, beside the prediction.

The worker's ``JobRunner`` owns one ``MemoryProbe``: ``begin`` before a job (CUDA peak
counters reset, a CPU peak sampler for runs), ``see`` for each event the job emits (bytes read
from disk; a load's CPU baseline when its tensors start loading), ``finish_load`` /
``finish_run`` after it, which return the ``MemoryReconciliation`` the job's result carries
(see ``memory_record`` for what each figure means, ``memory_readings`` for how each is read).

Measurements:

- weights resident per device: parameters and persistent buffers of the model, plus the
  in-memory state dicts of the offload hooks' weight maps (CPU-offloaded blocks of a GPU map),
  each byte counted once (tied weights, views, slices of one mapped shard);
- CPU: the worker's anonymous RSS the job added above the load's baseline (``Anonymous`` of
  ``/proc/self/smaps_rollup``; during a run the peak of ``RssAnon``, sampled every 2 ms), plus
  the weights a zero-copy load left memory-mapped from the checkpoint (file pages, not
  anonymous). The baseline is taken as the tensors start loading: the imports, the empty model
  and the tokenizer are built by then. What the load added before that (``runtime_bytes``) is
  measured too and shown apart, as a note: no prediction covers it;
- CUDA: ``torch.cuda.memory_allocated`` after a load, ``max_memory_allocated`` during a run,
  for every device the job initialised (nothing on a machine without CUDA);
- disk: file bytes of the offloaded weights; bytes read: the checkpoint bytes the load's
  progress counted, or the ``"disk"`` transfers of a run's forwards (the transfer telemetry).

Predicted: the weights the map places per device (checkpoint headers; non-persistent buffers
such as rotary ``inv_freq`` are left out on both sides, see ``without_non_persistent_buffers``),
plus for a run the KV cache and activation peak of the memory model at the run's real shape (``predict_run_reserve``)
and the largest offloaded block on the device that runs it (``offload_staging_bytes``).

Example:
    >>> probe = MemoryProbe()  # doctest: +SKIP
    >>> probe.begin("load")  # doctest: +SKIP
    >>> # ... the load, with every event it emits through probe.see(event) ...
    >>> record = probe.finish_load(model, summary.nbytes_by_device)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from workbench.big_modeling.device_map.coverage import non_persistent_buffer_names
from workbench.big_modeling.device_map.value import device_for
from workbench.big_modeling.devices import device_label, device_sort_key
from workbench.big_modeling.planning.device_reserve import reserve_per_device
from workbench.big_modeling.planning.sizes import format_nbytes
from workbench.big_modeling.quantization.sizes import quantized_weight_nbytes
from workbench.runtime.memory_readings import (
    AnonPeakSampler,
    cuda_devices_in_use,
    file_mapped_bytes,
    offloaded_file_bytes,
    read_anonymous_bytes,
    release_free_heap,
    weight_ranges,
)
from workbench.runtime.memory_record import DeviceMemory, MemoryReconciliation
from workbench.runtime.protocol import Event, Phase, Progress, TransferBatch

__all__ = [
    "MemoryProbe",
    "offload_staging_bytes",
    "predict_run_reserve",
    "quantized_weights_prediction",
    "without_non_persistent_buffers",
]

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------
# The prediction: the weights a load holds, the reserve of a run
# ------------------------------------------------------------------------------------------


def without_non_persistent_buffers(
    nbytes: Mapping[str, int],
    sizes: Mapping[str, int],
    device_map: Mapping[str, object],
    model: nn.Module,
) -> dict[str, int]:
    """``nbytes`` (bytes per device of the map's entries, as the module tree counts them) less
    the model's non-persistent buffers (rotary ``inv_freq``, BERT's ``position_ids``).

    No checkpoint holds them, and they are real tensors of the empty model, built before a
    load's CPU baseline; ``resident_weight_bytes`` skips them, so predicted and measured
    weights count the same tensors. (Dispatch moves those of a GPU entry to its GPU, where
    their few bytes are in ``memory_allocated`` unpredicted.)

    Args:
        nbytes: bytes per device label, from ``sizes`` summed over the map's entries.
        sizes: the tree's bytes per module and tensor name (``module_sizes()``); a tied alias
            has no entry and takes nothing off.
        device_map: the map ``nbytes`` was summed over.
        model: the model whose buffers are looked for.

    Example:
        >>> model = nn.Linear(2, 2)
        >>> model.register_buffer("inv_freq", torch.ones(4), persistent=False)
        >>> without_non_persistent_buffers({"cpu": 40}, {"": 40, "inv_freq": 16}, {"": "cpu"}, model)
        {'cpu': 24}
    """
    out = dict(nbytes)
    for name in non_persistent_buffer_names(model):
        device = device_for(name, device_map)
        if device is not None and name in sizes:
            label = device_label(device)
            out[label] = out.get(label, 0) - int(sizes[name])
    return out


def quantized_weights_prediction(
    predicted: Mapping[str, int], report: Any, model: nn.Module
) -> dict[str, int]:
    """The weights per device a quantized load should hold: ``predicted`` (the map's bytes at
    the load dtype) with each weight ``quantize_model`` converted counted at its precision's
    size (``quantization.sizes``, the planner's formula), on the tier it was converted on.

    Args:
        predicted: bytes per device label before quantization.
        report: the ``QuantizeReport`` of the load.
        model: the model the report names modules of.
    """
    out = dict(predicted)
    for converted in report.modules:
        linear = model.get_submodule(converted.name)
        rows, columns = int(linear.out_features), int(linear.in_features)
        dtype = linear.weight.dtype  # a torchao tensor reports the dtype it was made from
        size = quantized_weight_nbytes(converted.precision, rows, columns, dtype)
        out[converted.tier] = out.get(converted.tier, 0) - converted.original_nbytes + size
    return out


def _main_device(device_map: Mapping[str, object]) -> str:
    """Where offloaded (cpu/disk) blocks run: the first GPU of the map, else the CPU."""
    accelerators = sorted(d for d in device_map.values() if isinstance(d, int))
    return f"cuda:{accelerators[0]}" if accelerators else "cpu"


def predict_run_reserve(
    config: Any,
    device_map: Mapping[str, object],
    *,
    prompt_tokens: int,
    new_tokens: int,
    dtype: torch.dtype,
) -> dict[str, int]:
    """KV cache plus activation peak per device for one run of this shape (batch 1).

    The cache holds ``prompt_tokens + new_tokens - 1`` positions (the last token is never fed
    back); the activation peak is the prefill's, with the logits of one position when tokens
    are generated (``generate`` keeps 1) and of every prompt position for a single forward
    (``new_tokens=0``). Offloaded layers run, and keep their cache, on the map's main device.

    Seam: this calls the engine's ``reserve_per_device``, the per-device memory model the
    planner's reserve is being wired to (``runtime.planning``); once that module has a runtime
    function for a device map's reserve, call it here so plan and reconciliation share it.

    Raises:
        BadInputError, ValueError, TypeError, AttributeError: the config lacks what the memory
            model needs (not a decoder, unknown attention), as ``reserve_per_device``.
    """
    context = max(1, prompt_tokens + max(new_tokens - 1, 0))
    reserve = reserve_per_device(
        config,
        device_map,
        batch=1,
        context=context,
        model_dtype=dtype,
        logits_to_keep=1 if new_tokens else max(1, prompt_tokens),
        offload_execution_device=_main_device(device_map),
        prompt_tokens=max(1, prompt_tokens),
    )
    return {device: item.nbytes for device, item in reserve.items()}


def offload_staging_bytes(
    entry_sizes: Mapping[str, int], device_map: Mapping[str, object]
) -> dict[str, int]:
    """Room an offloaded block's weights take on the device that runs it, during its forward.

    Dispatch brings each offloaded map entry (``"disk"`` and ``"cpu"``) to the GPU that runs
    the model for its forward and drops it after, one at a time (no prefetch): the peak there
    holds the largest such entry. When the CPU runs the model nothing is copied: a disk
    entry's weights are memory-mapped from the offload folder for its forward (file pages,
    which the CPU's anonymous figure does not hold), so there is no room to predict.

    Example:
        >>> offload_staging_bytes({"a": 10, "b": 30, "c": 20}, {"a": 0, "b": "cpu", "c": "disk"})
        {'cuda:0': 30}
        >>> offload_staging_bytes({"a": 10, "c": 20}, {"a": "cpu", "c": "disk"})
        {}
    """
    main = _main_device(device_map)
    if main == "cpu":
        return {}
    offloaded = {"cpu", "disk"}
    sizes = [
        int(entry_sizes.get(name, 0))
        for name, device in device_map.items()
        if device_label(device) in offloaded
    ]
    largest = max(sizes, default=0)
    return {main: largest} if largest else {}


# ------------------------------------------------------------------------------------------
# The probe a JobRunner owns
# ------------------------------------------------------------------------------------------


class MemoryProbe:
    """Measures one job at a time (see the module docstring); not thread-safe by design: the
    runner calls it on the job's thread, events included."""

    def __init__(self) -> None:
        self.baseline_bytes: int | None = None  # anonymous RSS as a load starts its tensors
        self.runtime_bytes: int | None = None  # what the load added before its tensors
        self._start_bytes: int | None = None  # anonymous RSS as the load began
        self._load_bytes: int | None = None  # anonymous RSS the load added, at its end
        self._run_start_bytes: int | None = None  # anonymous RSS as a run began
        self._job = ""
        self._read_bytes = 0
        self._sampler: AnonPeakSampler | None = None

    def begin(self, job: str) -> None:
        """Before ``job`` (``"load"`` after the previous model was dropped, or ``"infer"``)."""
        self._job, self._read_bytes = job, 0
        if job == "load":
            self._start_bytes, self._load_bytes = read_anonymous_bytes(), None
            self.baseline_bytes, self.runtime_bytes = self._start_bytes, None  # until "loading"
        for index in cuda_devices_in_use():
            try:
                torch.cuda.reset_peak_memory_stats(index)
            except RuntimeError:  # a device that cannot say: its peak covers more than the job
                logger.debug("cannot reset the CUDA peak of device %d", index, exc_info=True)
        if job == "infer":
            self._sampler = AnonPeakSampler()
            self._run_start_bytes = self._sampler.start_bytes  # the same counter as the peak
            self._sampler.start()

    def see(self, event: Event) -> None:
        """Count the disk bytes ``event`` says were read; take a load's CPU baseline when its
        tensors start loading (the imports it needed are done, the model is built empty, the
        tokenizer is loaded), and what the load added before that."""
        if self._job == "load" and isinstance(event, Phase) and event.phase == "loading":
            release_free_heap()  # free heap pages the load's own trim would return: not in it
            self.baseline_bytes = read_anonymous_bytes()
            if self.baseline_bytes is not None and self._start_bytes is not None:
                self.runtime_bytes = max(0, self.baseline_bytes - self._start_bytes)
        elif self._job == "load" and isinstance(event, Progress) and event.phase == "loading":
            self._read_bytes = max(self._read_bytes, event.bytes_done)
        elif isinstance(event, TransferBatch):
            self._read_bytes += sum(
                e.nbytes for e in event.events if e.kind == "transfer" and e.source == "disk"
            )

    def abandon(self) -> None:
        """The job failed: stop the peak sampler."""
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None

    def finish_load(
        self, model: nn.Module, predicted_weights: Mapping[str, int]
    ) -> MemoryReconciliation:
        """The record after a load: resident bytes against the map's weights per device."""
        anonymous = read_anonymous_bytes()  # first: what measuring allocates is not the load's
        return self._record(
            model, predicted_weights, {}, anonymous=anonymous, peak_cpu=None, context=0
        )

    def finish_run(
        self,
        model: nn.Module,
        predicted_weights: Mapping[str, int],
        *,
        config: Any,
        device_map: Mapping[str, object],
        prompt_tokens: int,
        new_tokens: int,
        dtype: torch.dtype,
        entry_sizes: Mapping[str, int] | None = None,
    ) -> MemoryReconciliation:
        """The record after a run: peaks against the weights plus the run's predicted reserve
        (KV cache and activations, ``predict_run_reserve``, and on the main device the
        largest offloaded block brought in for its forward, ``offload_staging_bytes``)."""
        peak = self._sampler.stop() if self._sampler is not None else None
        anonymous = read_anonymous_bytes()  # before the prediction and the weights' walk
        self._sampler = None
        notes: list[str] = []
        try:
            reserve = predict_run_reserve(
                config,
                device_map,
                prompt_tokens=prompt_tokens,
                new_tokens=new_tokens,
                dtype=dtype,
            )
        except Exception as exc:  # a model the memory model does not cover: weights only
            reserve = {}
            notes.append(f"no KV/activation prediction: {exc}")
        for device, nbytes in offload_staging_bytes(entry_sizes or {}, device_map).items():
            reserve[device] = reserve.get(device, 0) + nbytes
        context = prompt_tokens + max(new_tokens - 1, 0)
        return self._record(
            model,
            predicted_weights,
            reserve,
            anonymous=anonymous,
            peak_cpu=peak,
            context=context,
            notes=notes,
        )

    def _record(
        self,
        model: nn.Module,
        predicted_weights: Mapping[str, int],
        reserve: Mapping[str, int],
        *,
        anonymous: int | None,
        peak_cpu: int | None,
        context: int,
        notes: list[str] | None = None,
    ) -> MemoryReconciliation:
        notes = list(notes or [])
        peak_words = "peak" if self._job == "infer" else "after the load"
        ranges = weight_ranges(model)
        weights = {device: sum(end - start for start, end in r) for device, r in ranges.items()}
        devices = {device_label(d) for d in predicted_weights} | set(weights) | {"cpu"}
        cuda = {f"cuda:{i}": i for i in cuda_devices_in_use()}
        devices |= {label for label, i in cuda.items() if torch.cuda.memory_allocated(i)}
        rows: list[DeviceMemory] = []
        for device in sorted(devices - {"disk"}, key=device_sort_key):
            predicted = int(predicted_weights.get(device, 0))
            row = DeviceMemory(
                device,
                predicted,
                int(reserve.get(device, 0)),
                measured_weights_bytes=weights.get(device, 0),
            )
            if device in cuda:
                index = cuda[device]
                allocated = int(torch.cuda.memory_allocated(index))
                peak = int(torch.cuda.max_memory_allocated(index))
                measured = peak if self._job == "infer" else allocated
                counter = "max_memory_allocated" if self._job == "infer" else "memory_allocated"
                how = f"torch.cuda {counter} ({peak_words})"
                row = _with(row, measured_bytes=measured, process_bytes=allocated, how=how)
            elif device == "cpu":
                mapped = file_mapped_bytes(ranges.get("cpu", []))
                row = self._cpu_row(row, anonymous, peak_cpu, mapped, notes)
            else:
                row = _with(row, how=f"no measurement for {device} here")
            rows.append(row)
        disk_predicted = int(predicted_weights.get("disk", 0))
        if disk_predicted or self._read_bytes:
            on_disk = offloaded_file_bytes(model) if disk_predicted else None
            rows.append(
                DeviceMemory(
                    "disk",
                    disk_predicted,
                    measured_weights_bytes=on_disk,
                    measured_bytes=on_disk,
                    read_bytes=self._read_bytes,
                    how="offload files; read: "
                    + ("checkpoint bytes loaded" if self._job == "load" else "disk transfers"),
                )
            )
        return MemoryReconciliation(self._job, tuple(rows), context, tuple(notes))

    def _cpu_row(
        self,
        row: DeviceMemory,
        anonymous: int | None,
        peak: int | None,
        mapped: int,
        notes: list[str],
    ) -> DeviceMemory:
        """Anonymous RSS the job added (``anonymous``: read as the job ended), plus the weights
        mapped from files (file pages)."""
        baseline = self.baseline_bytes
        if anonymous is None or baseline is None:
            notes.append("CPU memory not measured: no /proc/self/smaps_rollup or status")
            return _with(row, how="not measured on this system")
        added = max(0, anonymous - baseline)
        how = (
            "anonymous RSS above the worker's as the load began reading tensors, with the "
            "empty model and the tokenizer built"
        )
        if peak is None:  # a load
            self._load_bytes = added
            how += " (after the load)"
        elif self._load_bytes is not None and self._run_start_bytes is not None:
            # the load's figure, plus the run's peak above what the worker held as it began
            # (what the worker allocated between jobs, e.g. sending results, is neither's)
            added = self._load_bytes + max(0, max(peak, anonymous) - self._run_start_bytes)
            how += (
                " (after the load), plus the run's peak above the worker's as the run began "
                "(sampled every 2 ms)"
            )
        else:
            added = max(0, max(peak, anonymous) - baseline)
            how += " (peak during the run, sampled every 2 ms)"
        if mapped:
            how += f", plus {format_nbytes(mapped)} of weights memory-mapped from files"
        if self.runtime_bytes is not None:
            notes.append(
                f"cpu runtime overhead: the load added {format_nbytes(self.runtime_bytes)} of "
                "anonymous RSS before its tensors (imports, the empty model, the tokenizer); "
                "measured apart, not predicted, not in cpu's measured total"
            )
        return _with(
            row,
            measured_bytes=added + mapped,
            process_bytes=anonymous,
            baseline_bytes=baseline,
            how=how,
            mapped_weights_bytes=mapped,
            runtime_bytes=self.runtime_bytes,
        )


def _with(row: DeviceMemory, **changes: Any) -> DeviceMemory:
    return replace(row, **changes)
