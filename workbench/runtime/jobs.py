"""Load, infer and verify jobs: the same code runs in the worker (GUI) and in process (CLI).

A ``JobRunner`` holds at most one loaded model. ``run(request, token)`` executes one request,
sending events through ``emit`` (progress throttled to ~20 Hz) and ending with exactly one
``Result`` or ``Failed`` (whose ``details`` say where the job got to, with the traceback). A
load reports the phases building, loading, (quantizing,) dispatching and ready. Jobs check
the ``CancelToken`` while the model is built, after the tokenizer, between tensors, between
quantized modules and before dispatch (loading) and between tokens (generation).
``iter_job`` wraps a run as a generator of events.

Developer extension point: a *load observer* (``JobRunner(emit, load_observer=...)``, or
``WorkerHost(load_observer="module:function")`` for the worker process) sees every load's tensor
count as it grows (a quantized load's modules count on after its tensors) and may act on it,
e.g. park the load at a known point (the tests' holds in ``tests/job_holds.py``). It is called once per load with an ``ObservedLoad``; ``Load.options``
reach it untouched, so it can take per-load parameters from there.

Example:
    >>> runner = JobRunner(print)  # doctest: +SKIP
    >>> runner.run(Load(1, source="demo/", device_map={"": "cpu"}), CancelToken())
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from workbench.big_modeling.errors import BadInputError, LoadCancelled
from workbench.big_modeling.progress import CancelToken, LoadProgress
from workbench.runtime.model_kind import is_causal_lm
from workbench.runtime.progress_throttle import ProgressThrottle
from workbench.runtime.protocol import (
    PAGING_IN,
    PROBING_WORKSPACE,
    Event,
    Failed,
    Infer,
    Load,
    LoadSummary,
    Phase,
    Progress,
    Request,
    Result,
    Unload,
    Verify,
)

logger = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """The model a load produced, with what inference and verify need."""

    request: Load
    opened: Any
    model: Any
    device_map: dict[str, int | str]
    summary: LoadSummary
    tokenizer: Any = None
    extras: dict[str, Any] = field(default_factory=dict)


class JobTrace:
    """Where a job got to: its last phase, the last tensor and bytes of its progress."""

    def __init__(self) -> None:
        self.phase = ""
        self.tensor = ""
        self.bytes_done = 0
        self.bytes_total = 0

    def see(self, event: Event) -> None:
        if isinstance(event, Phase):
            self.phase = event.phase
        elif isinstance(event, Progress):
            self.phase = event.phase or self.phase
            self.tensor = event.tensor or self.tensor
            self.bytes_done, self.bytes_total = event.bytes_done, event.bytes_total

    def describe(self) -> str:
        """One line per fact, for ``Failed.details`` (empty when nothing was seen)."""
        lines = []
        if self.phase:
            lines.append(f"last phase: {self.phase}")
        if self.tensor:
            lines.append(f"last tensor: {self.tensor}")
        if self.bytes_total:
            lines.append(f"bytes loaded: {self.bytes_done} of {self.bytes_total}")
        return "\n".join(lines)


@dataclass(frozen=True)
class ObservedLoad:
    """What a load observer is given when a load starts loading tensors.

    Attributes:
        request: the load (its ``options`` as the host sent them).
        token: the load's cancel token.
        emit: sends an event to the host, like the job's own events.
        flush_progress: sends the latest progress report now, past the throttle.
    """

    request: Load
    token: CancelToken
    emit: Callable[[Event], None]
    flush_progress: Callable[[], None]


#: Called once per load; returns a callable that receives the count of tensors loaded so far
#: after every progress report (on the loading thread), or None to watch nothing.
LoadObserver = Callable[[ObservedLoad], Callable[[int], None] | None]


def import_load_observer(spec: str) -> LoadObserver:
    """The load observer named by ``spec``, ``"package.module:function"``.

    The module is imported with the current ``sys.path`` (a spawned worker starts with its
    host's).

    Raises:
        ValueError: when ``spec`` is not ``module:function``.
        ImportError: when the module cannot be imported.
        AttributeError: when the module has no such function.
        TypeError: when what it names is not callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"load observer {spec!r}: expected 'module:function'")
    observer = getattr(importlib.import_module(module_name), attr)
    if not callable(observer):
        raise TypeError(f"load observer {spec!r} is not callable")
    return observer


def _failure(request: Request, exc: Exception, trace: JobTrace) -> Failed:
    """The ``Failed`` event for ``exc``: its category, a message, and details to act on."""
    where = trace.describe()
    details = "\n\n".join(part for part in (where, traceback.format_exc().rstrip()) if part)
    if isinstance(exc, LoadCancelled):
        message, kind = f"{request.kind} cancelled: {exc}", "cancelled"
    elif isinstance(exc, (BadInputError, FileNotFoundError, NotADirectoryError)):
        message, kind = str(exc), "bad_input"
    else:
        message, kind = f"{request.kind} failed: {type(exc).__name__}: {exc}", "error"
    return Failed(request.request_id, message, details=details, kind=kind, job=request.kind)


class JobRunner:
    """Runs requests one at a time against the model it holds.

    Args:
        emit: receives every event; called on the thread that calls ``run``.
        load_observer: called once per load with an ``ObservedLoad`` (see the module
            docstring); default none.
    """

    def __init__(
        self, emit: Callable[[Event], None], *, load_observer: LoadObserver | None = None
    ) -> None:
        self.emit = emit
        self.load_observer = load_observer
        self.loaded: LoadedModel | None = None
        self._memory_probe: Any = None  # a MemoryProbe, made by the first job (torch)

    def run(self, request: Request, token: CancelToken) -> Event:
        """Execute ``request``; emit and return its final ``Result`` or ``Failed`` event.

        Every ``Failed`` carries ``details``: where the job was (its last phase, tensor and
        bytes) and the traceback.
        """
        trace = JobTrace()
        probe = self._probe()

        def emit(event: Event) -> None:
            trace.see(event)
            probe.see(event)
            self.emit(event)

        try:
            if isinstance(request, Load):
                self.unload()
                probe.begin("load")
                self.loaded = load_model(request, token, emit, observer=self.load_observer)
                self.loaded.summary = _with_load_memory(self.loaded, probe)
                final: Event = Result(request.request_id, "load", self.loaded.summary)
            elif isinstance(request, Unload):
                self.unload()
                final = Result(request.request_id, "unload", None)
            elif isinstance(request, (Infer, Verify)):
                if self.loaded is None:
                    raise BadInputError(
                        f"cannot {request.kind}: no model is loaded; load one first"
                    )
                if isinstance(request, Infer):
                    from workbench.runtime.inference import run_inference  # noqa: PLC0415 (torch; the GUI imports jobs)

                    probe.begin("infer")
                    value: Any = run_inference(
                        self.loaded, request, token, emit, timed_part_done=probe.end_run
                    )
                    value = _with_run_memory(
                        self.loaded,
                        value,
                        probe,
                        lambda: emit(Phase(request.request_id, PROBING_WORKSPACE)),
                    )
                else:
                    from workbench.runtime.verify import run_verify  # noqa: PLC0415 (torch; the GUI imports jobs)

                    value = run_verify(self.loaded, request, token, emit)
                final = Result(request.request_id, request.kind, value)
            else:
                raise BadInputError(f"the worker does not run {type(request).__name__} requests")
        except Exception as exc:
            probe.abandon()
            if not isinstance(exc, LoadCancelled):
                logger.debug("%s failed", request.kind, exc_info=True)
            if isinstance(request, Load):
                self.unload()
            final = _failure(request, exc, trace)
        self.emit(final)
        return final

    def _probe(self) -> Any:
        if self._memory_probe is None:
            from workbench.runtime.memory_reconcile import MemoryProbe  # noqa: PLC0415 (torch; the GUI imports jobs)

            self._memory_probe = MemoryProbe()
        return self._memory_probe

    def unload(self) -> None:
        """Drop the model and return its memory to the allocators."""
        if self.loaded is None:
            return
        self.loaded = None
        buffers = sys.modules.get("workbench.big_modeling.quantization.dense_buffers")
        if buffers is not None:  # a quantized model's CPU dequantize buffers go with it
            buffers.release_dequantize_buffers()
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def close(self) -> None:
        self.unload()


def _with_load_memory(loaded: LoadedModel, probe: Any) -> LoadSummary:
    """The load's summary with its predicted-vs-measured memory (unchanged if that fails:
    measuring never fails a load)."""
    try:
        record = probe.finish_load(loaded.model, loaded.summary.nbytes_by_device)
    except Exception:
        logger.warning("memory after the load not measured", exc_info=True)
        return loaded.summary
    return replace(loaded.summary, memory=record)


def _with_run_memory(
    loaded: LoadedModel, value: Any, probe: Any, before_probing: Callable[[], None]
) -> Any:
    """``value`` (an ``InferenceResult``) with the run's predicted-vs-measured memory;
    ``before_probing()`` announces a matmul workspace probe (seconds)."""
    try:
        params = (p for p in loaded.model.parameters() if p.is_floating_point())
        first = next(params, None)
        record = probe.finish_run(
            loaded.model,
            loaded.summary.nbytes_by_device,
            config=getattr(loaded.opened, "config", None),
            device_map=loaded.device_map,
            prompt_tokens=int(value.prompt_tokens),
            new_tokens=int(value.new_tokens),
            dtype=first.dtype if first is not None else None,
            entry_sizes=_entry_sizes(loaded.opened),
            precision_map=loaded.extras.get("precision_map"),
            before_probing=before_probing,
        )
    except Exception:
        probe.abandon()
        logger.warning("memory after the run not measured", exc_info=True)
        return value
    return replace(value, memory=record)


def iter_job(runner: JobRunner, request: Request, token: CancelToken) -> Iterator[Event]:
    """Run ``request`` on a thread and yield its events as they come (generator form).

    Closing the generator early cancels the job and waits for it to stop.
    """
    events: queue.Queue[Event | None] = queue.Queue()
    previous_emit = runner.emit
    runner.emit = events.put

    def work() -> None:
        try:
            runner.run(request, token)
        finally:
            events.put(None)

    thread = threading.Thread(target=work, name=f"job-{request.kind}", daemon=True)
    thread.start()
    try:
        while (event := events.get()) is not None:
            yield event
    finally:
        token.cancel()
        thread.join()
        runner.emit = previous_emit


# ------------------------------------------------------------------------------------------
# The load job
# ------------------------------------------------------------------------------------------


def load_model(
    request: Load,
    token: CancelToken,
    emit: Callable[[Event], None],
    *,
    observer: LoadObserver | None = None,
) -> LoadedModel:
    """Open ``request.source``, build it empty, load its checkpoint and dispatch it.

    Phases (as ``Phase`` events and in ``Progress.phase``): building, loading, quantizing (a
    load with a precision map: its progress counts weight bytes quantized), dispatching, paging
    in (the memory-mapped CPU weights: ``page_in``; cancellable between tensors), ready.
    The tokenizer loads while building, before the tensors, so the CPU memory the load measures
    above its baseline is the weights' (``memory_reconcile``). The cancel token is checked while
    the model is built, after the tokenizer, between tensors, between quantized modules and
    before dispatch. ``observer`` is called when the tensors start loading (see
    ``LoadObserver``).

    Raises:
        LoadCancelled: when ``token`` is cancelled.
        BadInputError: for a source without a checkpoint, a bad map, a corrupt checkpoint.
    """
    from workbench.big_modeling import dispatch_model, load_checkpoint_in_model  # noqa: PLC0415 (torch; the GUI imports jobs)
    from workbench.big_modeling.device_map.value import normalize_device_map  # noqa: PLC0415 (torch; the GUI imports jobs)
    from workbench.big_modeling.devices import check_devices_available  # noqa: PLC0415 (torch; the GUI imports jobs)
    from workbench.big_modeling.dtypes import parse_dtype  # noqa: PLC0415 (torch; the GUI imports jobs)
    from workbench.models.gguf import is_gguf_path  # noqa: PLC0415 (torch; the GUI imports jobs)
    from workbench.runtime.c_heap import release_free_heap  # noqa: PLC0415 (torch; the GUI imports jobs)
    from workbench.runtime.model_inputs import model_dtype  # noqa: PLC0415 (torch; the GUI imports jobs)
    from workbench.runtime.page_in import page_in_cpu_weights  # noqa: PLC0415 (torch; the GUI imports jobs)
    from workbench.runtime.runtime_warmup import warm_up_runtime  # noqa: PLC0415 (torch; the GUI imports jobs)

    check_devices_available(request.device_map)  # before the build: cuda:99, mps, meta named
    rid = request.request_id
    start_s = time.perf_counter()
    dtype = parse_dtype(request.dtype)
    emit(Phase(rid, "building"))  # read the config, build the empty model
    source = request.source
    if is_gguf_path(source):  # convert for loading: once per file, cached by its hash
        from workbench.models.gguf_convert import convert_gguf  # noqa: PLC0415 (transformers: only when a job needs it)

        source = str(convert_gguf(source, cancel=token))
    opened = open_model_cancellable(source, dtype, token)
    record = request.options.get("model_record")  # a wrapped map's fingerprint
    if record:
        from workbench.big_modeling.device_map.files import check_model_record  # noqa: PLC0415 (torch; the GUI imports jobs)

        check_model_record(record, opened.model, source=request.options.get("map_file", "map"))
    if opened.checkpoint is None:
        raise BadInputError(
            f"{request.source}: has no weights (no safetensors or .bin checkpoint); "
            "loading needs a model folder with weights, not just a config.json"
        )
    tokenizer = _load_tokenizer(opened)  # before the tensors: not in the load's CPU figure
    compute_dtype = dtype or model_dtype(opened.model)
    _import_quantizers(request.options, compute_dtype)  # runtime too
    warm_up_runtime(tokenizer, compute_dtype)  # thread pools, attention's first call: runtime
    token.raise_if_cancelled()
    total = int(getattr(opened.checkpoint, "total_nbytes", 0) or 0)
    emit(Progress(rid, 0, total, phase="building"))
    emit(Phase(rid, "loading"))
    throttle = ProgressThrottle(emit, rid)
    if observer is not None:
        throttle.on_tensor = observer(ObservedLoad(request, token, emit, throttle.flush))

    def progress(report: LoadProgress) -> None:
        throttle(report)
        token.raise_if_cancelled()

    model = opened.model
    device_map = dict(request.device_map)
    offload_folder = request.offload_folder
    if offload_folder is not None:
        Path(offload_folder).mkdir(parents=True, exist_ok=True)
    # load_checkpoint_and_dispatch in two steps, so dispatch is a phase of its own
    load_checkpoint_in_model(
        model,
        _checkpoint_path(opened),
        device_map=device_map,
        offload_folder=offload_folder,
        dtype=dtype,
        offload_state_dict="disk" in normalize_device_map(device_map).values(),
        progress=progress,
        cancel=token,
    )
    throttle.flush()
    token.raise_if_cancelled()
    done = throttle.last.bytes_done if throttle.last is not None else total
    quantized = None
    if request.options.get("precision_map") or request.options.get("quantize"):
        from workbench.big_modeling.quantization.apply import quantize_model, resolve_precision_map  # noqa: PLC0415 (torchao: only quantized loads)

        emit(Phase(rid, "quantizing"))
        precisions = resolve_precision_map(
            model, request.options.get("precision_map"), request.options.get("quantize")
        )
        # its reports count weight bytes quantized, and each module once in the observer's count
        quantized = quantize_model(
            model, precisions, offload_folder=offload_folder, progress=progress, cancel=token
        )
        throttle.flush()
        token.raise_if_cancelled()
    emit(Phase(rid, "dispatching"))
    throttle(LoadProgress(done, total, "", "dispatching"))
    model = dispatch_model(model, device_map=device_map, offload_dir=offload_folder)
    model.eval()
    emit(Phase(rid, PAGING_IN))  # the mapped CPU weights, before the first run needs them
    page_in_cpu_weights(model, cancel=token)
    release_free_heap()  # the casts and offload writes freed as they went; malloc kept them
    token.raise_if_cancelled()
    emit(Phase(rid, "ready"))
    summary = LoadSummary(
        source=str(request.source),
        model_class=type(model).__name__,
        device_map=device_map,
        nbytes_by_device=_predicted_weights(opened, device_map, model, quantized),
        load_s=time.perf_counter() - start_s,
        bytes_total=total,
        is_causal_lm=is_causal_lm(model),
        has_tokenizer=tokenizer is not None,
        chat_template=bool(getattr(tokenizer, "chat_template", None)),
    )
    loaded = LoadedModel(request, opened, model, device_map, summary, tokenizer)
    if quantized is not None:  # what each module really became (the speed model's kernels)
        loaded.extras["precision_map"] = {m.name: m.precision for m in quantized.modules}
    return loaded


def _import_quantizers(options: dict[str, Any], dtype: Any) -> None:
    """Import the quantization libraries a quantized load will use (torchao, and bitsandbytes
    for nf4/fp4) and warm each precision up (``backends.warm_up_quantization``: the libraries'
    first-call set-up) before the load's CPU baseline is read, so that memory counts as
    runtime, not as the weights'. ``dtype``: the weights' compute dtype."""
    precision_map, quantize = options.get("precision_map"), options.get("quantize")
    if not precision_map and not quantize:
        return
    import workbench.big_modeling.quantization.apply  # noqa: F401, PLC0415 (torchao)
    from workbench.big_modeling.quantization.backends import warm_up_quantization  # noqa: PLC0415
    from workbench.big_modeling.quantization.precisions import parse_precision  # noqa: PLC0415

    names = sorted({str(name) for name in [*(precision_map or {}).values(), quantize] if name})
    kinds = set()
    with contextlib.suppress(ValueError):  # a bad name is the quantizer's clear error
        kinds = {parse_precision(name).kind for name in names}
    if kinds & {"nf4", "fp4"}:
        with contextlib.suppress(ImportError):  # a missing one is the quantizer's clear error
            import bitsandbytes  # noqa: F401, PLC0415
    warm_up_quantization(names, dtype)  # a name that fails is the quantizer's clear error


_OPEN_LOCK = threading.Lock()  # one open_model at a time, even after a cancelled one
OPEN_POLL_S = 0.02


def open_model_cancellable(source: str, dtype: Any, token: CancelToken) -> Any:
    """``open_model`` on a helper thread, so a cancel while the model is built returns at once.

    A cancelled open finishes in the background and is discarded; the next open waits for it
    (the lock), so two builds never run together.

    Raises:
        LoadCancelled: when ``token`` is cancelled before the model is built.
    """
    from workbench.models import open_model  # noqa: PLC0415 (torch; the GUI imports jobs)

    token.raise_if_cancelled()
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def build() -> None:
        try:
            with _OPEN_LOCK:
                if token.cancelled:
                    return
                outcome["opened"] = open_model(source, dtype=dtype)
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=build, name="open-model", daemon=True).start()
    while not done.wait(OPEN_POLL_S):
        token.raise_if_cancelled()
    token.raise_if_cancelled()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["opened"]


def _checkpoint_path(opened: Any) -> str:
    """The path the engine loads from: the checkpoint index's own path, else the source."""
    folder = getattr(opened, "folder", None)
    if folder is not None and Path(folder).is_dir():
        return str(folder)
    for attr in ("source", "index_file"):
        value = getattr(opened.checkpoint, attr, None)
        if isinstance(value, (str, Path)) and Path(value).exists():
            return str(value)
    return str(opened.source)


def _load_tokenizer(opened: Any) -> Any:
    folder = getattr(opened, "tokenizer_dir", None)
    if not folder:
        return None
    folder = Path(folder)
    names = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
    if not any((folder / name).exists() for name in names):
        return None
    try:
        from transformers import AutoTokenizer  # noqa: PLC0415 (transformers: only when a job needs it)

        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # a broken tokenizer must not fail the load: synthetic input
        logger.warning("tokenizer in %s could not be loaded (%s); using token ids", folder, exc)
        return None


def _entry_sizes(opened: Any) -> dict[str, int]:
    """Bytes per module name, as the opened model's tree counts them (header sizes)."""
    tree = getattr(opened, "tree", None)
    return tree.module_sizes() if tree is not None else {}


def _predicted_weights(
    opened: Any, device_map: dict[str, int | str], model: Any, quantized: Any
) -> dict[str, int]:
    """Weight bytes per device the load should hold (checkpoint tensors: non-persistent buffers
    left out); a quantized load's at its precisions."""
    from workbench.runtime.memory_prediction import (  # noqa: PLC0415 (torch; the GUI imports jobs)
        quantized_weights_prediction,
        without_non_persistent_buffers,
    )

    sizes = _entry_sizes(opened)
    nbytes = without_non_persistent_buffers(
        _nbytes_by_device(opened, device_map), sizes, device_map, model
    )
    if quantized is None:
        return nbytes
    return quantized_weights_prediction(nbytes, quantized, model)


def _nbytes_by_device(opened: Any, device_map: dict[str, int | str]) -> dict[str, int]:
    from workbench.big_modeling.devices import device_label  # noqa: PLC0415 (torch; the GUI imports jobs)

    sizes = _entry_sizes(opened)
    out: dict[str, int] = {}
    for name, device in device_map.items():
        label = device_label(device)
        out[label] = out.get(label, 0) + int(sizes.get(name, 0))
    return out
