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
  ``/proc/self/smaps_rollup``; during a run the peak of ``RssAnon``, sampled every 2 ms, above
  its start after a heap trim, so that it reuses no earlier run's freed pages, until its last
  forward returns: ``end_run``; what the worker allocates to report it is not the run's), plus
  the weights a zero-copy load left memory-mapped from the checkpoint (file pages, not
  anonymous). The baseline is taken as the tensors start loading: the imports, the empty model
  and the tokenizer are built by then. What the load added before that (``runtime_bytes``) is
  measured too and shown apart, as a note: no prediction covers it;
- CUDA: ``torch.cuda.memory_allocated`` after a load, ``max_memory_allocated`` during a run,
  for every device the job initialised (nothing on a machine without CUDA);
- disk: file bytes of the offloaded weights; bytes read: the checkpoint bytes the load's
  progress counted, or the ``"disk"`` transfers of a run's forwards (the transfer telemetry).

Predicted (``memory_prediction``): the weights the map places per device (checkpoint headers;
non-persistent buffers such as rotary ``inv_freq`` are left out on both sides), plus for a run
the KV cache and activation peak of the memory model at the run's real shape and the largest
offloaded block on the device that runs it, the dense copy an nf4/fp4/int8 matmul dequantizes
into (``dequantize_buffer_prediction``; on the CPU a buffer kept for the next run, so a run adds
only what it grows by), and on the CPU the buffers its matmul libraries keep after the run's new
matmul shapes (``gemm_workspace``, probed once per CPU and cached).
Not predicted, and said in a note: the freed blocks the C heap kept for reuse at the end of a
run (``c_heap.heap_free_bytes``), which a CPU peak after a long prompt can include.

Example:
    >>> probe = MemoryProbe()  # doctest: +SKIP
    >>> probe.begin("load")  # doctest: +SKIP
    >>> # ... the load, with every event it emits through probe.see(event) ...
    >>> record = probe.finish_load(model, summary.nbytes_by_device)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from workbench.big_modeling.devices import device_label, device_sort_key
from workbench.big_modeling.planning.sizes import format_nbytes
from workbench.big_modeling.quantization.dense_buffers import held_dequantize_buffer_bytes
from workbench.runtime.c_heap import heap_free_bytes, release_free_heap
from workbench.runtime.gemm_workspace import GemmCall, cpu_gemm_calls, cpu_gemm_workspace_bytes
from workbench.runtime.memory_prediction import (
    dequantize_buffer_prediction,
    offload_staging_bytes,
    predict_run_reserve,
)
from workbench.runtime.memory_readings import (
    AnonPeakSampler,
    cuda_devices_in_use,
    file_mapped_bytes,
    offloaded_file_bytes,
    read_anonymous_bytes,
    weight_ranges,
)
from workbench.runtime.memory_record import DeviceMemory, MemoryReconciliation
from workbench.runtime.protocol import Event, Phase, Progress, TransferBatch

__all__ = ["MemoryProbe"]

logger = logging.getLogger(__name__)
HEAP_NOTE_BYTES = 2**20  # freed heap bytes a run's record mentions


class MemoryProbe:
    """Measures one job at a time (see the module docstring); not thread-safe by design: the
    runner calls it on the job's thread, events included."""

    def __init__(self) -> None:
        self.baseline_bytes: int | None = None  # anonymous RSS as a load starts its tensors
        self.runtime_bytes: int | None = None  # what the load added before its tensors
        self._start_bytes: int | None = None  # anonymous RSS as the load began
        self._load_bytes: int | None = None  # anonymous RSS the load added, at its end
        self._run_start_bytes: int | None = None  # anonymous RSS as a run began
        self._run_start_heap_free: int | None = None  # freed bytes the C heap held then
        self._run_start_dequantize = 0  # dequantize buffers held as the run began
        self._run_peak_bytes: int | None = None  # the run's CPU peak, once its forwards end
        self._job = ""
        self._read_bytes = 0
        self._sampler: AnonPeakSampler | None = None
        self._gemm_done: list[GemmCall] = []  # CPU matmuls this process already ran

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
            # freed heap pages go back first: reused by the run, they would be in its baseline
            # and out of its peak (a second run of the same prompt measured 1-2 MiB low)
            release_free_heap()
            self._run_start_heap_free = heap_free_bytes()
            self._run_start_dequantize = held_dequantize_buffer_bytes()
            self._run_peak_bytes = None
            self._sampler = AnonPeakSampler()
            self._sampler.start()
            self._run_start_bytes = self._sampler.start_bytes  # the same counter as the peak

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

    def end_run(self) -> None:
        """The run's last forward returned: its CPU peak is final (what the worker does next,
        reading mapped bytes, predicting speed, is not the run's). ``finish_run`` uses it."""
        if self._sampler is not None:
            self._run_peak_bytes = self._sampler.stop()
            self._sampler = None

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
        precision_map: Mapping[str, str] | None = None,
        before_probing: Callable[[], None] | None = None,
    ) -> MemoryReconciliation:
        """The record after a run: peaks against the weights plus the run's predicted reserve
        (KV cache and activations, ``predict_run_reserve``; on the main device the largest
        offloaded block brought in for its forward, ``offload_staging_bytes``; the 4-bit
        weights' dense copies of ``precision_map``'s modules, the load's converted ones,
        ``dequantize_buffer_prediction``). ``before_probing()`` is called before a matmul
        workspace is probed (not cached)."""
        self.end_run()  # a no-op when the run ended its measurement itself
        peak, self._run_peak_bytes = self._run_peak_bytes, None
        anonymous = read_anonymous_bytes()  # before the prediction and the weights' walk
        notes: list[str] = []
        kept = heap_free_bytes()
        if kept is not None and self._run_start_heap_free is not None:
            kept -= self._run_start_heap_free
        if kept is not None and kept >= HEAP_NOTE_BYTES:
            notes.append(
                f"cpu heap: the C allocator held {format_nbytes(kept)} more of freed blocks "
                "for reuse at the end of the run than at its start; such blocks make a CPU "
                "peak exceed the live "
                "tensors the prediction counts (glibc's dynamic mmap threshold; "
                "WORKBENCH_MMAP_THRESHOLD=131072 returns each at once, at a speed cost)"
            )
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
        self._dequantize_buffers(model, precision_map or {}, device_map, reserve, notes)
        workspace = self._gemm_workspace(
            model, device_map, prompt_tokens, new_tokens, notes, before_probing
        )
        if workspace:
            reserve["cpu"] = reserve.get("cpu", 0) + workspace
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

    def _dequantize_buffers(
        self,
        model: nn.Module,
        precision_map: Mapping[str, str],
        device_map: Mapping[str, object],
        reserve: dict[str, int],
        notes: list[str],
    ) -> None:
        """Add the nf4/fp4/int8 weights' dense copies to ``reserve``: on the CPU what the kept buffer
        grows by in this run (what it held as the run began is in the baseline)."""
        for device, nbytes in dequantize_buffer_prediction(
            model, precision_map, device_map
        ).items():
            added = max(0, nbytes - self._run_start_dequantize) if device == "cpu" else nbytes
            reserve[device] = reserve.get(device, 0) + added
            kept = (
                f"; {format_nbytes(nbytes - added)} of it held since an earlier run"
                if device == "cpu" and added < nbytes
                else ""
            )
            notes.append(
                f"{device} dequantize: {format_nbytes(nbytes)} for the largest nf4/fp4/int8 "
                f"weight in its compute dtype{kept}; in {device}'s predicted reserve"
            )

    def _gemm_workspace(
        self,
        model: nn.Module,
        device_map: Mapping[str, object],
        prompt_tokens: int,
        new_tokens: int,
        notes: list[str],
        before_probing: Callable[[], None] | None,
    ) -> int:
        """The matmul libraries' buffers the run's new CPU matmuls leave resident
        (``gemm_workspace``: probed in a fresh process, after the calls this process already
        made, whose buffers the baseline holds)."""
        calls = cpu_gemm_calls(
            model, device_map, prompt_tokens=prompt_tokens, new_tokens=new_tokens
        )
        new = [call for call in calls if call not in self._gemm_done]
        if not new:
            return 0
        nbytes = cpu_gemm_workspace_bytes(
            new, warm=self._gemm_done, before_measuring=before_probing
        )
        self._gemm_done.extend(new)
        if nbytes is None:
            notes.append("cpu matmul workspace not probed (see the log); not in the prediction")
            return 0
        notes.append(
            f"cpu matmul workspace: {format_nbytes(nbytes)} the CPU's matmul libraries keep "
            f"after the run's {len(new)} new matmul shapes (probed once for this CPU, thread "
            "count and shapes); in cpu's predicted reserve"
        )
        return nbytes

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
            added = self._load_bytes + max(0, peak - self._run_start_bytes)
            how += (
                " (after the load), plus the run's peak above the worker's as the run began "
                "(sampled every 2 ms)"
            )
        else:
            added = max(0, peak - baseline)
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
