"""``workbench run SOURCE --device-map map.json``: load, generate, chat, verify, headless.

Runs the same jobs the GUI runs: in the worker process by default, or in this process with
``--in-process``. Prints load progress (stderr), the generated text as it streams, tokens/s,
time to first token (measured, and predicted for this machine or ``--profile``), per-layer
transfer times of the last forward, and the verify result (logits, then the greedy
continuation token by token). ``--json`` prints one JSON document instead.

``--chat`` talks through the model's chat template (``--system`` sets the system prompt):
with ``--prompt`` one turn, otherwise interactively in the terminal, turn after turn, until an
empty line or end of input (``/new`` starts a new chat, Ctrl+C stops an answer). Decoding is
greedy unless ``--temperature`` is above 0; ``--top-p``, ``--top-k`` and ``--seed`` shape the
sampling, ``--repetition-penalty`` acts in both modes.

Exit codes: 0 success, 1 a job failed or verification found a difference, 2 bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import queue
import shutil
import sys
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from workbench.commands.run_pipeline import add_pipeline_arguments, run_pipeline_command
from workbench.runtime import BadInputError, CancelToken
from workbench.runtime.formatting import paged_in_words
from workbench.runtime.jobs import JobRunner
from workbench.runtime.offload_folders import new_offload_folder
from workbench.runtime.protocol import (
    Event,
    Failed,
    Infer,
    InferenceResult,
    Load,
    LoadSummary,
    Log,
    Progress,
    Result,
    Sampling,
    TokenStreamed,
    Verify,
    VerifyResult,
    WorkerExited,
)
from workbench.wording import plural, with_article

VERIFY_GREEDY_TOKENS = 16  # --verify also compares this many greedy tokens, one by one


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="load a model along a device map, generate text, verify it",
        description="Load SOURCE along a device map (in a worker process), run an inference "
        "test and optionally verify the dispatched outputs against an undispatched CPU copy.",
    )
    parser.add_argument("source", help="model folder with weights (config.json + safetensors)")
    parser.add_argument(
        "--device-map",
        metavar="MAP.json",
        help="device map file (default: the whole model on the CPU)",
    )
    parser.add_argument(
        "--prompt", help="prompt text, or with --chat the user's message (default: random ids)"
    )
    parser.add_argument(
        "--chat",
        action="store_true",
        help="chat through the model's chat template: one turn with --prompt, else "
        "interactive in the terminal (empty line or Ctrl+D ends, /new starts over)",
    )
    parser.add_argument("--system", help="the chat's system prompt (implies --chat)")
    parser.add_argument("--max-new-tokens", type=int, default=16, metavar="N")
    sampling = parser.add_argument_group("sampling (default: greedy decoding)")
    sampling.add_argument(
        "--temperature", type=float, metavar="T", help="sample at this temperature (0: greedy)"
    )
    sampling.add_argument(
        "--top-p", type=float, metavar="P", help="sample from the tokens holding P of the mass"
    )
    sampling.add_argument("--top-k", type=int, metavar="K", help="sample from the K likeliest")
    sampling.add_argument("--seed", type=int, metavar="N", help="sampler seed (default 0)")
    sampling.add_argument(
        "--repetition-penalty",
        type=float,
        metavar="R",
        help="above 1, tokens already in the text become less likely (greedy too)",
    )
    parser.add_argument("--dtype", help="load weights in this dtype (default: as stored)")
    quantization = parser.add_mutually_exclusive_group()
    quantization.add_argument(
        "--quantize",
        metavar="PRECISION",
        help="quantize every Linear with torchao (int8, int4-g32/64/128, fp8), keeping lm_head, "
        "tied weights and MoE routers as loaded; --verify then reports top-1 agreement",
    )
    quantization.add_argument(
        "--precision-map",
        metavar="MAP.json",
        help='per-module precisions, e.g. {"": "bfloat16", "model.layers": "int4-g64"}',
    )
    parser.add_argument("--profile", help="hardware profile for the predicted speed")
    parser.add_argument("--verify", action="store_true", help="compare with an undispatched run")
    parser.add_argument(
        "--verify-mode",
        default="auto",
        choices=("auto", "full", "layers"),
        help="full copy, layer by layer, or auto (full when it fits in RAM)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--in-process", action="store_true", help="run the jobs here instead of a worker process"
    )
    add_pipeline_arguments(parser)
    parser.set_defaults(func=run)


def sampling_from_args(args: argparse.Namespace) -> Sampling:
    """The ``Sampling`` the options ask for.

    Raises:
        BadInputError: for sampling options given without ``--temperature`` (they would do
            nothing), or bad values (``check_sampling`` names each).
    """
    from workbench.runtime.sampling import check_sampling  # noqa: PLC0415 (torch: not at CLI start)

    temperature = args.temperature
    sampled = temperature is not None and temperature > 0
    only_when_sampling = [
        flag
        for flag, value in (("--top-p", args.top_p), ("--top-k", args.top_k), ("--seed", args.seed))
        if value is not None
    ]
    if only_when_sampling and not sampled:
        raise BadInputError(
            f"{', '.join(only_when_sampling)} only act when sampling; add --temperature T "
            "(T > 0), or drop them for greedy decoding"
        )
    defaults = Sampling()
    return check_sampling(
        Sampling(
            greedy=not sampled,
            temperature=temperature if sampled else defaults.temperature,
            top_p=defaults.top_p if args.top_p is None else args.top_p,
            top_k=defaults.top_k if args.top_k is None else args.top_k,
            repetition_penalty=(
                defaults.repetition_penalty
                if args.repetition_penalty is None
                else args.repetition_penalty
            ),
            seed=defaults.seed if args.seed is None else args.seed,
        )
    )


def run(args: argparse.Namespace) -> int:
    from workbench.runtime import load_device_map, read_device_map  # noqa: PLC0415 (torch: not at CLI start)

    if args.max_new_tokens < 0:
        raise BadInputError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if args.pipeline_stages is not None:
        return run_pipeline_command(args)
    sampling = sampling_from_args(args)
    chat = args.chat or args.system is not None
    device_map = load_device_map(args.device_map) if args.device_map else {"": "cpu"}
    record = read_device_map(args.device_map).model_record if args.device_map else None
    # a wrapped map's model record is checked against the model once the worker has built it
    options = {"model_record": record, "map_file": args.device_map} if record else {}
    options |= _quantization_options(args)
    printer = _Printer(json_mode=args.json)
    runner: _Runner = _InProcess(printer) if args.in_process else _ThroughWorker(printer)
    report: dict[str, Any] = {"source": str(args.source), "device_map": args.device_map}
    system = (("system", args.system),) if args.system else ()
    try:
        loaded = runner.load(str(args.source), device_map, args.dtype, options)
        report["load"] = _as_json(loaded)
        printer.loaded(loaded)
        if chat and args.prompt is None:
            report["chat"] = _chat_in_terminal(runner, printer, args, system, sampling)
        else:
            messages = (*system, ("user", args.prompt)) if chat else ()
            inference = runner.infer(
                args.prompt, args.max_new_tokens, args.profile, messages, sampling
            )
            report["inference"] = _as_json(inference)
            printer.inference(inference)
        if args.verify:
            verified = runner.verify(args.prompt, args.verify_mode)
            report["verify"] = _as_json(verified)
            printer.verify(verified)
    finally:
        printer.close_bar()
        runner.close()
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    return 1 if args.verify and not report["verify"]["passed"] else 0


def _quantization_options(args: argparse.Namespace) -> dict[str, Any]:
    """The load options for ``--quantize`` / ``--precision-map`` (the worker applies them).

    Raises:
        BadInputError: the map file is not a JSON object of module name -> precision name.
    """
    from workbench.runtime import read_json  # noqa: PLC0415 (torch: not at CLI start)

    if args.quantize:
        return {"quantize": args.quantize}
    if not args.precision_map:
        return {}
    fix = 'write {"module name": "precision", ...}, e.g. {"": "bfloat16", "model.layers": "int8"}'
    value = read_json(args.precision_map, what="a precision map", fix=fix, error=BadInputError)
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadInputError(f"{args.precision_map}: expected a JSON object of strings; {fix}")
    return {"precision_map": value}


def _chat_in_terminal(
    runner: _Runner,
    printer: _Printer,
    args: argparse.Namespace,
    system: tuple[tuple[str, str], ...],
    sampling: Sampling,
) -> dict[str, Any]:
    """Read a message per line, answer each through the chat template, keep the turns.

    Returns the chat for ``--json``: the messages and each turn's result.
    """
    turns: list[tuple[str, str]] = []
    results: list[Any] = []
    printer.say(
        "chat: an empty line or Ctrl+D ends, /new starts a new chat, Ctrl+C stops an answer"
    )
    while True:
        try:
            line = input("" if printer.json_mode else "you> ")
        except EOFError:
            printer.say("")
            break
        text = line.strip()
        if not text or text in ("/exit", "/quit"):
            break
        if text == "/new":
            turns.clear()
            printer.say("(a new chat)")
            continue
        printer.say_inline("model> ")
        try:
            result = runner.infer(
                None, args.max_new_tokens, args.profile, (*system, *turns, ("user", text)), sampling
            )
        except KeyboardInterrupt:
            runner.wait_idle()
            printer.say(" (stopped)")
            continue
        printer.chat_turn(result)
        turns += [("user", text), ("assistant", result.text)]
        results.append(_as_json(result))
    return {"messages": [list(m) for m in (*system, *turns)], "turns": results}


class _JobFailed(RuntimeError):
    pass


def _final_value(final: Event) -> Any:
    if isinstance(final, Result):
        return final.value
    assert isinstance(final, Failed)
    if final.kind == "bad_input":
        raise BadInputError(final.message)
    if final.kind == "cancelled":
        raise KeyboardInterrupt
    raise _JobFailed(final.message + (f"\n{final.details}" if final.details else ""))


Messages = tuple[tuple[str, str], ...]


class _Runner:
    def load(
        self, source: str, device_map: dict, dtype: str | None, options: dict | None = None
    ) -> LoadSummary:
        raise NotImplementedError

    def infer(
        self,
        prompt: str | None,
        max_new_tokens: int,
        profile: str | None,
        messages: Messages = (),
        sampling: Sampling | None = None,
    ) -> InferenceResult:
        raise NotImplementedError

    def wait_idle(self) -> None:
        """After Ctrl+C stopped a job: wait until the runner takes the next one."""

    def verify(self, prompt: str | None, mode: str) -> VerifyResult:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _InProcess(_Runner):
    """Runs the jobs on this thread."""

    def __init__(self, printer: _Printer) -> None:
        self._runner = JobRunner(printer.event)
        self._folder = new_offload_folder(None)
        self._next = 0

    def _run(self, request_type: Callable[..., Any], **fields: Any) -> Any:
        self._next += 1
        return _final_value(self._runner.run(request_type(self._next, **fields), CancelToken()))

    def load(
        self, source: str, device_map: dict, dtype: str | None, options: dict | None = None
    ) -> LoadSummary:
        return self._run(
            Load,
            source=source,
            device_map=device_map,
            dtype=dtype,
            offload_folder=str(self._folder),
            options=dict(options or {}),
        )

    def infer(
        self,
        prompt: str | None,
        max_new_tokens: int,
        profile: str | None,
        messages: Messages = (),
        sampling: Sampling | None = None,
    ) -> InferenceResult:
        return self._run(
            Infer,
            prompt=prompt,
            max_new_tokens=max_new_tokens,
            profile=profile,
            messages=messages,
            sampling=sampling or Sampling(),
        )

    def verify(self, prompt: str | None, mode: str) -> VerifyResult:
        return self._run(Verify, prompt=prompt, mode=mode, greedy_tokens=VERIFY_GREEDY_TOKENS)

    def close(self) -> None:
        self._runner.close()
        shutil.rmtree(self._folder, ignore_errors=True)


class _ThroughWorker(_Runner):
    """Runs the jobs in a worker process; events are printed on this (the main) thread."""

    def __init__(self, printer: _Printer) -> None:
        from workbench.runtime.worker import WorkerHost  # noqa: PLC0415 (torch: not at CLI start)

        self._printer = printer
        self._events: queue.Queue[Event] = queue.Queue()
        self.host = WorkerHost(self._events.put)

    def _wait(self, request_id: int) -> Any:
        try:
            while True:
                event = self._events.get()
                self._printer.event(event)
                if isinstance(event, (Result, Failed)) and event.request_id == request_id:
                    return _final_value(event)
                if isinstance(event, WorkerExited) and not event.expected:
                    raise _JobFailed(event.message)
        except KeyboardInterrupt:
            self.host.cancel()
            raise

    def load(
        self, source: str, device_map: dict, dtype: str | None, options: dict | None = None
    ) -> LoadSummary:
        return self._wait(self.host.load(source, device_map, dtype=dtype, options=options))

    def infer(
        self,
        prompt: str | None,
        max_new_tokens: int,
        profile: str | None,
        messages: Messages = (),
        sampling: Sampling | None = None,
    ) -> InferenceResult:
        request_id = self.host.infer(
            prompt,
            max_new_tokens=max_new_tokens,
            profile=profile,
            messages=messages,
            sampling=sampling,
        )
        return self._wait(request_id)

    def wait_idle(self) -> None:
        self.host.wait_idle()

    def verify(self, prompt: str | None, mode: str) -> VerifyResult:
        return self._wait(self.host.verify(prompt, mode=mode, greedy_tokens=VERIFY_GREEDY_TOKENS))

    def close(self) -> None:
        self.host.shutdown()


class _Printer:
    """Human output: a progress bar and warnings on stderr, streamed text and a summary on
    stdout."""

    def __init__(self, *, json_mode: bool) -> None:
        self.json_mode = json_mode
        self._bar: Any = None
        self._phase = ""
        self.device_map: dict[str, Any] = {}

    def event(self, event: Event) -> None:
        if self.json_mode:
            return
        if isinstance(event, Progress):
            self._progress(event)
        elif isinstance(event, Log) and event.level >= logging.WARNING:
            print(f"worker: {event.message}", file=sys.stderr)
        elif isinstance(event, TokenStreamed):
            sys.stdout.write(event.text)
            sys.stdout.flush()

    def _progress(self, event: Progress) -> None:
        if self._bar is None:
            self._bar = tqdm(
                total=event.bytes_total,
                unit="B",
                unit_scale=True,
                desc=event.phase,
                file=sys.stderr,
            )
        if self._bar.total != event.bytes_total:
            self._bar.total = event.bytes_total
        self._bar.update(event.bytes_done - self._bar.n)
        if self._phase != event.phase:  # each phase is drawn at least once
            self._phase = event.phase
            self._bar.set_description(event.phase)

    def close_bar(self) -> None:
        """End the progress bar (the load finished or failed)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def loaded(self, summary: LoadSummary) -> None:
        self.close_bar()
        if self.json_mode:
            return
        self.device_map = dict(summary.device_map)
        per_device = ", ".join(
            f"{d} {n / 2**20:.1f} MiB" for d, n in summary.nbytes_by_device.items()
        )
        print(f"loaded {summary.model_class} in {summary.load_s:.2f} s ({per_device})")
        _print_memory(summary.memory)

    def say(self, line: str) -> None:
        """A line for people (nothing in ``--json`` mode: stdout holds the document)."""
        if not self.json_mode:
            print(line)

    def say_inline(self, text: str) -> None:
        if not self.json_mode:
            sys.stdout.write(text)
            sys.stdout.flush()

    def chat_turn(self, result: InferenceResult) -> None:
        """After a streamed answer: one short line of figures."""
        if self.json_mode:
            return
        ended = "end of turn" if result.stop_reason == "eos" else "max new tokens reached"
        print(
            f"\n  [{result.new_tokens} tokens, {result.tokens_per_s:.2f} tokens/s, "
            f"time to first token {result.ttft_s * 1000:.0f} ms; {ended}]"
        )

    def inference(self, result: InferenceResult) -> None:
        if self.json_mode:
            return
        print()
        if result.chat_template:
            print("prompt: built with the model's chat template")
        elif result.prompt_text and result.prompt_text.endswith("Assistant:"):
            print("prompt: plain 'Role: text' lines (the model has no chat template)")
        from workbench.runtime.sampling import describe_sampling  # noqa: PLC0415 (torch: not at CLI start)

        if not result.one_forward:  # a forward picks no token
            print(f"sampling: {describe_sampling(result.sampling)}")
        predicted = result.predicted
        hardware = result.predicted_for
        where = "this machine" if hardware in ("", "detected") else f"profile {hardware}"
        if result.one_forward:  # nothing generated: a forward's time is the only speed figure
            if result.prompt_tokens == 0:
                head = "one forward on a synthetic input"
            else:
                head = f"one forward over {plural(result.prompt_tokens, 'token')} (no generation)"
            print(f"{head}: {result.ttft_s * 1000:.1f} ms")
            if "forward_s" in predicted:
                print(f"predicted for {where}: {predicted['forward_s'] * 1000:.1f} ms")
        else:
            print(
                f"{plural(result.new_tokens, 'token')} from {with_article(f'{result.prompt_tokens}-token prompt')}: "
                f"{result.tokens_per_s:.2f} tokens/s, "
                f"time to first token {result.ttft_s * 1000:.1f} ms"
            )
            if predicted:
                print(
                    f"predicted for {where}: {predicted['tokens_per_s']:.2f} tokens/s, "
                    f"time to first token {predicted['ttft_s'] * 1000:.1f} ms"
                )
        paged = paged_in_words(result.paged_in_bytes, one_forward=result.one_forward)
        if paged:
            print(paged)
        from workbench.runtime.telemetry import group_layers  # noqa: PLC0415 (numpy: not at CLI start)

        units = [key for key in self.device_map if key]
        moved = [layer for layer in group_layers(result.per_layer, units) if layer.nbytes]
        if moved:
            print("weight transfers in the last forward (per device-map entry):")
            for layer in moved:
                print(
                    f"  {layer.module:<48} {layer.source:>5} -> {layer.destination:<7} "
                    f"{layer.nbytes / 2**20:8.2f} MiB {layer.transfer_s * 1000:8.2f} ms "
                    f"{layer.gbps:6.2f} GB/s, compute {layer.compute_s * 1000:8.2f} ms"
                )
        else:
            print("no weight transfers in the last forward (everything resident)")
        _print_memory(result.memory)

    def verify(self, result: VerifyResult) -> None:
        if self.json_mode:
            return
        if result.top1_positions and not result.exact:  # a quantized load
            percent = 100 * result.top1_agreed // result.top1_positions
            print(
                f"verify: {'PASS' if result.passed else 'FAIL'} against {result.reference}: "
                f"top-1 agreement {percent}% ({result.top1_agreed}/{result.top1_positions}), "
                f"max |dlogit| {result.max_abs_diff:.2g}, mean {result.mean_abs_diff:.2g}"
            )
            return
        if result.exact:
            verdict = "identical"
        elif result.passed:
            verdict = "within tolerance"
        elif not math.isfinite(result.max_abs_diff):
            verdict = "DIFFERENT (non-finite outputs)"
        else:
            verdict = "DIFFERENT"
        where = f" (largest in {result.worst_module})" if result.worst_module else ""
        print(
            f"verify: {verdict} to {result.reference}; max abs diff {result.max_abs_diff:.3g}"
            f"{where}, max rel diff {result.max_rel_diff:.3g}"
        )
        if result.greedy_compared:
            same = "identical" if result.greedy_identical else "DIFFERENT"
            print(
                f"verify: greedy continuation {same}: {result.greedy_matched} of "
                f"{result.greedy_compared} tokens match ({result.greedy_text!r})"
            )


def _as_json(value: Any) -> Any:
    """A result as plain data; its memory record with predicted totals and errors per device."""
    if not dataclasses.is_dataclass(value):
        return value
    data = dataclasses.asdict(value)
    memory = getattr(value, "memory", None)
    if memory is not None:
        data["memory"] = memory.as_json()
    return data


def _print_memory(memory: Any) -> None:
    """The predicted-vs-measured table of a load or a run (nothing when not measured)."""
    if memory is None:
        return
    what = "after the load" if memory.job == "load" else "during the run"
    print(f"memory {what}, predicted against measured:")
    for line in memory.table_lines():
        print(f"  {line}")
    for note in memory.notes:
        print(f"  note: {note}")
