"""Inference tests on a loaded model: generation with streamed tokens, or one forward.

Causal LMs generate up to ``max_new_tokens`` tokens with a KV cache (greedy or sampled, see
``sampling``), one ``TokenStreamed`` event per token and one ``TransferBatch`` per forward; a
chat (``Infer.messages``) is built with the tokenizer's chat template (``chat``) and ends at
the end-of-turn token. Other models run one forward on the tokenized prompt (or seeded
synthetic token ids), and models that take no text on a synthetic input of the shape their
config declares (``model_inputs``). The result carries time to first token, tokens/s, the last
forward's per-layer transfer and compute times, and the speed model's prediction for the same
plan on the named hardware.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from workbench.big_modeling.devices import to_torch_device
from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.progress import CancelToken
from workbench.big_modeling.transfers import TransferEvent, recording_transfers
from workbench.models.attention_probe import AttentionTimes, cached_attention_times
from workbench.models.forward_arguments import cache_argument
from workbench.models.hardware import (
    DETECTED_NAME,
    detect_hardware,
    host_probes_applied,
    load_profile,
    profile_from_dict,
    with_host_probes,
)
from workbench.models.speed import attention_shapes_for, layer_unit_names, predict_speed
from workbench.runtime.chat import chat_prompt, stop_token_ids
from workbench.runtime.memory_prediction import main_device
from workbench.runtime.memory_readings import read_mapped_bytes
from workbench.runtime.model_inputs import (
    SYNTHETIC_SEED,
    ModelInputs,
    accepts,
    check_positions,
    prepare_input_ids,
    prepare_inputs,
)
from workbench.runtime.planning import attention_layout_or_none
from workbench.runtime.precision_session import quantized_tree
from workbench.runtime.protocol import (
    PROBING_HOST,
    Event,
    Infer,
    InferenceResult,
    Phase,
    TokenStreamed,
)
from workbench.runtime.sampling import TokenPicker, sampling_dict
from workbench.runtime.telemetry import TransferRecorder, summarize_layers

logger = logging.getLogger(__name__)

__all__ = [
    "SYNTHETIC_SEED",
    "execution_device",
    "prepare_input_ids",
    "prepare_inputs",
    "run_inference",
]


def execution_device(device_map: dict[str, int | str]) -> torch.device:
    """Where inputs go: the first accelerator of the map, else the CPU."""
    accelerators = sorted(d for d in device_map.values() if isinstance(d, int))
    if accelerators:
        return to_torch_device(accelerators[0])
    if "mps" in device_map.values():
        return torch.device("mps")
    return torch.device("cpu")


class ComputeTimer:
    """Times the forward of selected modules and reports ``kind="compute"`` events.

    Used when the engine's hooks report transfers only. On CUDA each timed module synchronises
    its device after the forward so the wall time covers the kernels.
    """

    def __init__(
        self, model: torch.nn.Module, names: list[str], report: Callable[[TransferEvent], None]
    ) -> None:
        self._report = report
        self._handles: list[Any] = []
        self._starts: dict[str, float] = {}
        modules = dict(model.named_modules())
        for name in names:
            module = modules.get(name)
            if module is None:
                continue
            self._handles.append(module.register_forward_pre_hook(self._pre(name)))
            self._handles.append(module.register_forward_hook(self._post(name)))

    def _pre(self, name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any) -> None:
            self._starts[name] = time.perf_counter()

        return hook

    def _post(self, name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            start = self._starts.pop(name, None)
            if start is not None:
                end = time.perf_counter()
                self._report(TransferEvent(name, 0, "", "", start, end, kind="compute"))

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def timed_module_names(loaded: Any) -> list[str]:
    """The modules whose compute is timed: the speed model's rows (``layer_unit_names``), so
    measured and predicted per-layer figures line up on every map. Without a module tree: the
    map's units, else the root's children."""
    tree = getattr(loaded.opened, "tree", None)
    names = [name for name in layer_unit_names(tree) if name] if tree is not None else []
    if names:
        return names
    units = [name for name in loaded.device_map if name]
    return units or [name for name, _ in loaded.model.named_children()]


@contextmanager
def _recording(loaded: Any, recorder: TransferRecorder) -> Iterator[None]:
    """Record the engine's events; time blocks ourselves only where no engine hook runs."""
    hooked = any(hasattr(m, "_hf_hook") for m in loaded.model.modules())
    timer = None if hooked else ComputeTimer(loaded.model, timed_module_names(loaded), recorder)
    try:
        with recording_transfers(recorder):
            yield
    finally:
        if timer is not None:
            timer.remove()


@contextmanager
def cancellable_forwards(
    model: torch.nn.Module, names: list[str], token: CancelToken
) -> Iterator[None]:
    """Check ``token`` before each of the modules ``names`` runs, not only between tokens.

    One token of a big offloaded model can take longer than the host's cancel grace period;
    checked per layer, Stop ends the forward within one layer and the worker keeps its model.
    The check runs before the engine's hook moves the layer's weights in, so nothing is left
    on the execution device.
    """
    modules = dict(model.named_modules())

    def check(_module: torch.nn.Module, _args: Any) -> None:
        token.raise_if_cancelled()

    handles = [modules[name].register_forward_pre_hook(check) for name in names if name in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def generate_tokens(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    picker: TokenPicker,
    *,
    stop_ids: frozenset[int] = frozenset(),
    token: CancelToken | None = None,
) -> Iterator[int]:
    """Generate up to ``max_new_tokens`` token ids after ``input_ids`` ``(1, T)`` with a KV
    cache, yielding each one as soon as its forward returns; stop after a ``stop_ids`` token.

    Works for our dispatched models and for plain ``transformers`` ones alike (verify compares
    the two token by token).

    Raises:
        LoadCancelled: when ``token`` is cancelled between tokens.
    """
    ids, past = input_ids, None
    cache_kw, cache_attr = cache_argument(model)
    extra = {"logits_to_keep": 1} if accepts(model, "logits_to_keep") else {}
    seen = [int(i) for i in input_ids[0].tolist()]
    for _ in range(max_new_tokens):
        if token is not None:
            token.raise_if_cancelled()
        out = model(input_ids=ids, **{cache_kw: past}, use_cache=True, **extra)
        token_id = picker.pick(out.logits[:, -1, :], seen)
        seen.append(token_id)
        past = getattr(out, cache_attr, None)
        yield token_id
        if token_id in stop_ids:
            return
        next_ids = torch.tensor([[token_id]], dtype=torch.long, device=ids.device)
        # a model without a cache gets the whole sequence again
        ids = torch.cat([ids, next_ids], dim=-1) if past is None else next_ids


def _prompt(loaded: Any, request: Infer) -> tuple[ModelInputs, str, bool]:
    """The forward's input, the prompt's text and whether a chat template built it."""
    if request.messages and loaded.tokenizer is not None:
        chat = chat_prompt(loaded.tokenizer, request.messages)
        inputs = ModelInputs({"input_ids": chat.input_ids}, int(chat.input_ids.shape[-1]), True)
        return inputs, chat.text, chat.chat_template
    if request.messages:
        raise BadInputError(
            f"{getattr(loaded.opened, 'source', 'the model')} has no tokenizer; a chat needs "
            "one (use a prompt, or a model folder with tokenizer files)"
        )
    inputs = prepare_inputs(loaded, request.prompt, request.synthetic_tokens)
    return inputs, request.prompt or "", False


def run_inference(
    loaded: Any,
    request: Infer,
    token: CancelToken,
    emit: Callable[[Event], None],
    *,
    timed_part_done: Callable[[], None] | None = None,
) -> InferenceResult:
    """Run the inference test ``request`` on ``loaded``; emit tokens and transfer batches.

    ``timed_part_done()`` is called as the model's last forward returns, before the result is
    put together (the worker's memory probe ends the run's measurement there: reading the
    mapped bytes and predicting the speed allocate too, and are not the run's).

    Raises:
        BadInputError: for bad sampling settings, or a chat the model cannot take.
        LoadCancelled: when ``token`` is cancelled between tokens.
    """
    rid = request.request_id
    picker = TokenPicker(request.sampling)
    folders = _weight_folders(loaded)
    file_backed = read_mapped_bytes(folders)
    start_s = time.perf_counter()
    inputs, prompt_text, templated = _prompt(loaded, request)
    inputs = inputs.to(execution_device(loaded.device_map))
    prompt_tokens = inputs.tokens
    recorder = TransferRecorder()
    model = loaded.model
    generate = loaded.summary.is_causal_lm and inputs.text and request.max_new_tokens > 0
    check_positions(loaded, prompt_tokens, request.max_new_tokens if generate else 0)
    stop_ids = stop_token_ids(model, loaded.tokenizer) if request.messages else frozenset()
    emit(Phase(rid, "generating" if generate else "forward"))
    new_ids: list[int] = []
    text = streamed = ""
    events: tuple[TransferEvent, ...] = ()
    first_token_s = last_token_s = 0.0
    stop_reason = "forward"
    checked = timed_module_names(loaded)
    with (
        torch.inference_mode(),
        _recording(loaded, recorder),
        cancellable_forwards(model, checked, token),
    ):
        if not generate:
            model(**inputs.kwargs)
            batch = recorder.drain(rid, 0)
            emit(batch)
            events = batch.events
            first_token_s = last_token_s = time.perf_counter()
        else:
            stop_reason = "max_new_tokens"
            steps = generate_tokens(
                model, inputs.main, request.max_new_tokens, picker, stop_ids=stop_ids, token=token
            )
            for step, token_id in enumerate(steps):
                now = time.perf_counter()
                if step == 0:
                    first_token_s = now
                last_token_s = now
                batch = recorder.drain(rid, step)
                emit(batch)
                events = batch.events
                new_ids.append(token_id)
                piece = ""
                if loaded.tokenizer is not None:
                    text = loaded.tokenizer.decode(new_ids, skip_special_tokens=True)
                    piece, streamed = next_piece(text, streamed)
                emit(TokenStreamed(rid, step, token_id, piece, now - start_s))
                if token_id in stop_ids:
                    stop_reason = "eos"
    end_s = time.perf_counter()
    if timed_part_done is not None:
        timed_part_done()
    after = read_mapped_bytes(folders)
    paged_in = max(0, after - file_backed) if after is not None and file_backed is not None else 0
    ttft_s = first_token_s - start_s
    if generate and len(new_ids) > 1:
        tokens_per_s = (len(new_ids) - 1) / max(last_token_s - first_token_s, 1e-9)
    elif generate:
        tokens_per_s = 1.0 / max(ttft_s, 1e-9)
    else:  # one forward: prompt tokens per second, or forwards per second for non-text input
        tokens_per_s = max(prompt_tokens, 1) / max(ttft_s, 1e-9)
    predicted = predict_figures(
        loaded,
        request.profile,
        prompt_tokens,
        announce=lambda phase: emit(Phase(rid, phase)),
        new_tokens=len(new_ids) if generate else 0,
        generating=bool(generate),
    )
    return InferenceResult(
        text=text,
        prompt_tokens=prompt_tokens,
        new_tokens=len(new_ids),
        ttft_s=ttft_s,
        tokens_per_s=tokens_per_s,
        total_s=end_s - start_s,
        per_layer=summarize_layers(events),
        predicted=predicted,
        token_ids=tuple(new_ids),
        prompt_text=prompt_text,
        chat_template=templated,
        stop_reason=stop_reason,
        sampling=sampling_dict(request.sampling),
        predicted_for=hardware_name(request.profile) if predicted else "",
        paged_in_bytes=paged_in,
    )


def _weight_folders(loaded: Any) -> list[str]:
    """The folders whose files a run may map weights from: the checkpoint's and the offload
    folder."""
    folders = [getattr(loaded.opened, "folder", None)]
    folders.append(getattr(getattr(loaded, "request", None), "offload_folder", None))
    return [str(folder) for folder in folders if folder and Path(folder).is_dir()]


def next_piece(decoded: str, streamed: str) -> tuple[str, str]:
    """The text to stream now and the text streamed so far after it.

    A trailing U+FFFD is held back: it is an incomplete UTF-8 sequence (byte-level tokenizers
    split characters across tokens) that a later token completes. Should the tokenizer rewrite
    text already streamed, nothing is streamed; the final result carries the full text.

    Example:
        >>> next_piece("caf\ufffd", "ca"), next_piece("café!", "caf")
        (('f', 'caf'), ('é!', 'café!'))
    """
    ready = decoded.rstrip("\ufffd")
    if not ready.startswith(streamed):
        return "", streamed
    return ready[len(streamed) :], ready


def predict_figures(
    loaded: Any,
    profile: str | Mapping[str, Any] | None,
    prompt_tokens: int,
    announce: Callable[[str], None] | None = None,
    *,
    new_tokens: int = 0,
    generating: bool = True,
) -> dict[str, float]:
    """The speed model's tokens/s and TTFT for this plan, and ``"forward_s"``: one forward over
    the prompt, the figure a run that generates nothing compares with ({} when it cannot predict).

    Args:
        loaded: the loaded model (``opened`` and ``device_map``).
        profile: a profile name, a profile's ``to_dict()`` data, or ``None`` (detected).
        prompt_tokens: the prompt length the TTFT is for; returned as ``"prompt_tokens"``.
        announce: called with ``PROBING_HOST`` before the host probes are measured (the
            detected profile, the first time on a machine; and the first time a model's
            attention shape runs on its CPU: ``attention_probe``).
        new_tokens: tokens the run generated: its decode steps read a cache of the prompt
            plus half of them on average.
        generating: the run generates (its prompt's forward computes the last position's
            logits only); otherwise one forward computes every position's.
    """
    try:
        if isinstance(profile, Mapping):
            hardware = profile_from_dict(dict(profile))
        else:
            hardware = load_profile(profile) if profile else detect_hardware()
        precisions = getattr(loaded, "extras", {}).get("precision_map") or {}
        sized = quantized_tree(loaded.opened, precisions) if precisions else loaded.opened.tree
        layout = attention_layout_or_none(loaded.opened)
        times: dict[str, AttentionTimes] = {}
        if hardware.name == DETECTED_NAME:  # measured once per machine, after the timed run
            hardware = with_host_probes(hardware, measure=False)
            on_cpu = main_device(loaded.device_map) == "cpu"
            shapes = attention_shapes_for(sized, layout) if layout and on_cpu else []
            times = cached_attention_times(shapes, measure_if_missing=False)
            if not host_probes_applied(hardware) or len(times) < len(shapes):
                if announce is not None:
                    announce(PROBING_HOST)
                hardware = with_host_probes(hardware)
                times = cached_attention_times(shapes)
        prediction = predict_speed(
            sized,
            loaded.device_map,
            hardware,
            prefetch=False,  # a load's dispatch copies each offloaded block when it runs
            prompt_tokens=prompt_tokens,
            precisions=precisions,
            attention=layout,
            attention_times=times,
            decode_context=prompt_tokens + new_tokens // 2,
            last_position_only=None if generating else False,
        )
    except Exception as exc:  # the prediction is informative; never fail the test over it
        logger.info("no speed prediction for this plan: %s", exc)
        return {}
    return {
        "tokens_per_s": float(prediction.tokens_per_s),
        "ttft_s": float(prediction.ttft_s),
        "forward_s": float(prediction.prefill_s),
        "prompt_tokens": float(prompt_tokens),
    }


def hardware_name(profile: str | Mapping[str, Any] | None) -> str:
    """The name of the hardware a prediction with ``profile`` is for (``"detected"``: this
    machine)."""
    if isinstance(profile, Mapping):
        return str(profile.get("name") or "custom")
    return str(profile) if profile else DETECTED_NAME
