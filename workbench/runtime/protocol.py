"""The typed messages between the GUI/CLI host and the worker process that holds the model.

Requests go host -> worker, events go worker -> host. Every message is a small frozen
dataclass that pickles cheaply (plain ints, floats, strings, tuples and dicts of those; engine
``TransferEvent`` objects are frozen dataclasses too). Each request carries a ``request_id``
that the events it causes repeat, so a view can ignore the events of a job it no longer shows.

Example:
    >>> req = Load(request_id=1, source="/models/demo", device_map={"": "cpu"})
    >>> req.kind
    'load'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.big_modeling.transfers import TransferEvent

if TYPE_CHECKING:  # its byte formatter imports torch: an idle worker must stay light
    from workbench.runtime.memory_record import MemoryReconciliation

# --------------------------------------------------------------------------------------------
# Requests (host -> worker)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """Base of every request; ``request_id`` is assigned by the host, unique per host."""

    request_id: int

    @property
    def kind(self) -> str:
        return type(self).__name__.lower()


@dataclass(frozen=True)
class Load(Request):
    """Open ``source``, build it empty, load its checkpoint and dispatch it along ``device_map``.

    ``offload_folder`` is the folder disk-offloaded weights go to; the host creates one per load
    and deletes it on cancel, unload, failure and worker death. ``options`` holds extras:
    ``model_record`` (the fingerprint a wrapped map was made for, checked against the built
    model) with ``map_file`` (the map's name in that check's message); every option also
    reaches the worker's load observer untouched (see ``workbench.runtime.jobs``).
    """

    source: str = ""
    device_map: dict[str, int | str] = field(default_factory=dict)
    dtype: str | None = None
    offload_folder: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sampling:
    """How each generated token is chosen (the names and meanings of ``transformers``'
    ``GenerationConfig``).

    ``greedy`` takes the most likely token; otherwise the token is drawn from the logits divided
    by ``temperature``, kept to the ``top_k`` most likely (0: all) and to the smallest set whose
    probability reaches ``top_p``, with a generator seeded by ``seed`` (the same seed, prompt and
    map give the same text). ``repetition_penalty`` > 1 makes tokens already in the sequence
    less likely, in both modes.
    """

    greedy: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class Infer(Request):
    """Run the loaded model: generation for causal LMs, one forward otherwise.

    ``prompt=None`` (or a model folder without a tokenizer) uses ``synthetic_tokens`` seeded
    random token ids. ``messages`` is a chat, ``(role, content)`` pairs (``"system"``,
    ``"user"``, ``"assistant"``) ending with the user's turn: the prompt is then built with the
    tokenizer's chat template (plain "Role: text" lines when it has none), ``prompt`` is unused
    and generation ends at the end-of-turn token. ``profile`` is the hardware the speed
    prediction stored next to the measured figures is for: a profile name, a profile's
    ``to_dict()`` data (a what-if profile the worker cannot look up by name), or ``None`` for
    the detected hardware.
    """

    prompt: str | None = None
    max_new_tokens: int = 16
    synthetic_tokens: int = 8
    profile: str | dict[str, Any] | None = None
    messages: tuple[tuple[str, str], ...] = ()
    sampling: Sampling = field(default_factory=Sampling)


@dataclass(frozen=True)
class Verify(Request):
    """Compare the dispatched model's output with the same weights run without dispatch on CPU.

    ``mode``: ``"full"`` (a whole undispatched copy, logits compared), ``"layers"`` (unit by
    unit, for models whose copy does not fit in RAM) or ``"auto"`` (full when it fits).
    ``greedy_tokens`` > 0 also generates that many greedy tokens with both models (full mode,
    causal LMs) and compares them token by token.
    """

    prompt: str | None = None
    mode: str = "auto"
    synthetic_tokens: int = 8
    atol: float = 0.0
    rtol: float = 0.0
    greedy_tokens: int = 0


@dataclass(frozen=True)
class Cancel(Request):
    """Cancel the running job (cooperative, checked between tensors / tokens)."""


@dataclass(frozen=True)
class Unload(Request):
    """Drop the loaded model and free its memory."""


@dataclass(frozen=True)
class Shutdown(Request):
    """Finish and exit the worker's loop."""


# --------------------------------------------------------------------------------------------
# Results carried by ``Result``
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerTiming:
    """Per-layer figures of one forward: weight transfer and compute seconds, bytes moved."""

    module: str
    transfer_s: float = 0.0
    compute_s: float = 0.0
    nbytes: int = 0
    source: str = ""
    destination: str = ""

    @property
    def gbps(self) -> float:
        """Achieved transfer bandwidth in GB/s (decimal), 0 when nothing moved."""
        return self.nbytes / self.transfer_s / 1e9 if self.transfer_s > 0 and self.nbytes else 0.0


@dataclass(frozen=True)
class LoadSummary:
    """What a finished load reports; ``memory``: predicted against measured bytes per device
    (see ``workbench.runtime.memory_record``), ``None`` when not measured."""

    source: str
    model_class: str
    device_map: dict[str, int | str]
    nbytes_by_device: dict[str, int]
    load_s: float
    bytes_total: int
    is_causal_lm: bool
    has_tokenizer: bool
    chat_template: bool = False
    memory: MemoryReconciliation | None = None


@dataclass(frozen=True)
class InferenceResult:
    """Measured figures of one inference test, with the speed model's prediction beside them.

    ``predicted`` holds ``{"tokens_per_s": .., "ttft_s": .., "forward_s": .., "prompt_tokens":
    ..}`` (empty when no prediction could be made) for the hardware named by ``predicted_for``;
    ``per_layer`` covers the last forward. A run of a model that generates nothing
    (``one_forward``) measures one forward: ``ttft_s`` is its time, to compare with the
    predicted ``forward_s``, and ``tokens_per_s`` the prompt tokens it processed per second.
    ``prompt_text`` is the text the model was given (after the chat template), ``chat_template``
    says whether the template built it, ``stop_reason`` is ``"eos"`` (the end-of-turn token),
    ``"max_new_tokens"`` or ``"forward"`` (one forward, no generation), and ``sampling`` holds
    the ``Sampling`` fields the run used. ``memory``: the run's peak bytes per device against
    the weights plus the predicted KV cache and activations (``None`` when not measured).
    ``paged_in_bytes``: pages of the model's files (checkpoint, offload folder) the run brought
    into the worker (``memory_readings.read_mapped_bytes`` growth): a load pages its
    memory-mapped CPU weights in (``page_in``), so this is what the kernel reclaimed since, or
    disk-offloaded weights read through their maps; the speed model does not count it.
    """

    text: str
    prompt_tokens: int
    new_tokens: int
    ttft_s: float
    tokens_per_s: float
    total_s: float
    per_layer: tuple[LayerTiming, ...] = ()
    predicted: dict[str, float] = field(default_factory=dict)
    token_ids: tuple[int, ...] = ()
    prompt_text: str = ""
    chat_template: bool = False
    stop_reason: str = ""
    sampling: dict[str, Any] = field(default_factory=dict)
    predicted_for: str = ""
    memory: MemoryReconciliation | None = None
    paged_in_bytes: int = 0

    @property
    def one_forward(self) -> bool:
        """True for a run that made one forward and generated nothing (an encoder, a
        classifier, a prompt-less input): its figures are a forward's time, not tokens/s."""
        return self.stop_reason == "forward"


@dataclass(frozen=True)
class VerifyResult:
    """Dispatched versus reference outputs. ``passed`` is ``max_abs_diff <= atol + rtol*|ref|``.

    ``greedy_compared`` greedy tokens were generated by both models (0: none);
    ``greedy_matched`` of them are equal before the first difference; the two texts are their
    decodings (dispatched, reference).
    """

    passed: bool
    max_abs_diff: float
    max_rel_diff: float
    exact: bool
    reference: str
    output_shape: tuple[int, ...]
    worst_position: tuple[int, ...] = ()
    worst_module: str = ""
    greedy_compared: int = 0
    greedy_matched: int = 0
    greedy_text: str = ""
    greedy_reference_text: str = ""
    top1_positions: int = 0  # quantized loads: next-token predictions compared (0: not quantized)
    top1_agreed: int = 0  # ... of which the argmax matched the full-precision reference's
    mean_abs_diff: float = 0.0  # ... and the mean |logit difference|

    @property
    def greedy_identical(self) -> bool | None:
        """True when every compared greedy token matched; ``None`` when none were compared."""
        return None if not self.greedy_compared else self.greedy_matched == self.greedy_compared


# --------------------------------------------------------------------------------------------
# Events (worker -> host; ``StateChanged`` and ``WorkerExited`` come from the host itself)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """Base of every event (``Failed.kind`` is a field: the failure's category)."""

    @property
    def type_name(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class Progress(Event):
    """Load progress, throttled to about 20 Hz. ``phase``: building, loading, dispatching."""

    request_id: int
    bytes_done: int
    bytes_total: int
    tensor: str = ""
    phase: str = "loading"
    eta_s: float | None = None

    @property
    def fraction(self) -> float:
        return 1.0 if self.bytes_total <= 0 else min(1.0, self.bytes_done / self.bytes_total)


@dataclass(frozen=True)
class Phase(Event):
    """A job entered a phase: opening, building, loading, dispatching, held, generating, ...
    and, after a run's timed part, ``PROBING_HOST`` / ``PROBING_WORKSPACE`` while a
    measurement that is cached afterwards runs (seconds, the first time only)."""

    request_id: int
    phase: str


PAGING_IN = "paging in"  # a load bringing its memory-mapped CPU weights into the worker
PROBING_HOST = "probing host"  # the host's dispatch costs and matmul curve, once per machine
PROBING_WORKSPACE = "probing matmul workspace"  # once per CPU and set of matmul shapes


@dataclass(frozen=True)
class Log(Event):
    """A log line from the worker; ``level`` is a ``logging`` level number."""

    level: int
    message: str
    request_id: int | None = None


@dataclass(frozen=True)
class CudaMemory:
    """One CUDA device's memory at a sample: torch allocator figures and NVML's used bytes."""

    device: int
    allocated_bytes: int
    reserved_bytes: int
    nvml_used_bytes: int | None = None
    total_bytes: int | None = None


@dataclass(frozen=True)
class TelemetrySample(Event):
    """Memory at one instant (``time_s`` on the worker's ``time.time`` clock).

    ``file_backed_bytes`` is the part of ``rss_bytes`` that maps files (Linux ``RssFile``):
    memory-mapped weights, clean and reclaimable. ``None`` where the platform does not say.
    It comes last, so positional construction and events pickled without it still work.
    """

    time_s: float
    rss_bytes: int
    available_bytes: int
    cuda: tuple[CudaMemory, ...] = ()
    file_backed_bytes: int | None = None


@dataclass(frozen=True)
class TransferBatch(Event):
    """Transfer and compute events of one forward (``forward_index`` counts from 0 per job)."""

    request_id: int
    forward_index: int
    events: tuple[TransferEvent, ...]


@dataclass(frozen=True)
class TokenStreamed(Event):
    """One generated token. ``text`` is the new piece of decoded text (may be empty)."""

    request_id: int
    index: int
    token_id: int
    text: str
    elapsed_s: float


@dataclass(frozen=True)
class Result(Event):
    """A job finished. ``job`` is the request kind; ``value`` its typed result (or ``None``)."""

    request_id: int
    job: str
    value: LoadSummary | InferenceResult | VerifyResult | None = None


@dataclass(frozen=True)
class Failed(Event):
    """A job failed. ``kind``: ``"cancelled"``, ``"bad_input"`` (the user can fix it),
    ``"error"`` (a bug or runtime failure, ``details`` has the traceback) or ``"worker_died"``.
    """

    request_id: int | None
    message: str
    details: str = ""
    kind: str = "error"
    job: str = ""


@dataclass(frozen=True)
class StateChanged(Event):
    """The host's state changed: stopped, starting, idle, loading, loaded, running."""

    state: str
    previous: str


@dataclass(frozen=True)
class WorkerExited(Event):
    """The worker process ended. ``signal`` is set when a signal killed it (9 for SIGKILL).

    ``expected`` is True for a requested shutdown or unload restart and for a terminate after
    an unanswered cancel (the user asked for the stop); False for a crash or an out-of-memory
    kill.
    """

    exitcode: int | None
    signal: int | None
    expected: bool
    message: str = ""


@dataclass(frozen=True)
class WorkerReady(Event):
    """A new worker process finished its imports (torch, transformers, the engine) and waits
    for requests: a load sent now pays only for the load. ``warmup_s`` is how long that took."""

    pid: int
    warmup_s: float


REQUEST_TYPES: tuple[type[Request], ...] = (Load, Infer, Verify, Cancel, Unload, Shutdown)
EVENT_TYPES: tuple[type[Event], ...] = (
    Progress,
    Phase,
    Log,
    TelemetrySample,
    TransferBatch,
    TokenStreamed,
    Result,
    Failed,
    StateChanged,
    WorkerExited,
    WorkerReady,
)
