"""``workbench run SOURCE --device-map map.json``: load, generate, verify, headless.

Runs the same jobs the GUI runs: in the worker process by default, or in this process with
``--in-process``. Prints load progress (stderr), the generated text as it streams, tokens/s,
time to first token (measured and predicted), per-layer transfer times of the last forward,
and the verify result. ``--json`` prints one JSON document instead.

Exit codes: 0 success, 1 a job failed or verification found a difference, 2 bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import queue
import sys
from collections.abc import Callable
from typing import Any

from workbench.big_modeling.errors import BadInputError
from workbench.runtime.protocol import (
    Event,
    Failed,
    InferenceResult,
    LoadSummary,
    Log,
    Progress,
    Result,
    TokenStreamed,
    VerifyResult,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="load a model along a device map, generate text, verify it",
        description="Load SOURCE along a device map (in a worker process), run an inference "
        "test and optionally verify the dispatched outputs against an undispatched CPU copy.",
    )
    parser.add_argument("source", help="model folder with weights (config.json + safetensors)")
    parser.add_argument("--device-map", required=True, metavar="MAP.json", help="device map file")
    parser.add_argument("--prompt", help="prompt text (default: seeded random token ids)")
    parser.add_argument("--max-new-tokens", type=int, default=16, metavar="N")
    parser.add_argument("--dtype", help="load weights in this dtype (default: as stored)")
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
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workbench.big_modeling.device_map import load_device_map

    if args.max_new_tokens < 0:
        raise BadInputError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    device_map = load_device_map(args.device_map)
    printer = _Printer(json_mode=args.json)
    runner: _Runner = _InProcess(printer) if args.in_process else _ThroughWorker(printer)
    report: dict[str, Any] = {"source": str(args.source), "device_map": args.device_map}
    try:
        loaded = runner.load(str(args.source), device_map, args.dtype)
        report["load"] = _as_json(loaded)
        printer.loaded(loaded)
        inference = runner.infer(args.prompt, args.max_new_tokens, args.profile)
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


class _Runner:
    def load(self, source: str, device_map: dict, dtype: str | None) -> LoadSummary:
        raise NotImplementedError

    def infer(
        self, prompt: str | None, max_new_tokens: int, profile: str | None
    ) -> InferenceResult:
        raise NotImplementedError

    def verify(self, prompt: str | None, mode: str) -> VerifyResult:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _InProcess(_Runner):
    """Runs the jobs on this thread."""

    def __init__(self, printer: _Printer) -> None:
        from workbench.runtime.jobs import JobRunner
        from workbench.runtime.offload_folders import new_offload_folder

        self._runner = JobRunner(printer.event)
        self._folder = new_offload_folder(None)
        self._next = 0

    def _run(self, request_type: Callable[..., Any], **fields: Any) -> Any:
        from workbench.big_modeling.progress import CancelToken

        self._next += 1
        return _final_value(self._runner.run(request_type(self._next, **fields), CancelToken()))

    def load(self, source: str, device_map: dict, dtype: str | None) -> LoadSummary:
        from workbench.runtime.protocol import Load

        return self._run(
            Load,
            source=source,
            device_map=device_map,
            dtype=dtype,
            offload_folder=str(self._folder),
        )

    def infer(
        self, prompt: str | None, max_new_tokens: int, profile: str | None
    ) -> InferenceResult:
        from workbench.runtime.protocol import Infer

        return self._run(Infer, prompt=prompt, max_new_tokens=max_new_tokens, profile=profile)

    def verify(self, prompt: str | None, mode: str) -> VerifyResult:
        from workbench.runtime.protocol import Verify

        return self._run(Verify, prompt=prompt, mode=mode)

    def close(self) -> None:
        import shutil

        self._runner.close()
        shutil.rmtree(self._folder, ignore_errors=True)


class _ThroughWorker(_Runner):
    """Runs the jobs in a worker process; events are printed on this (the main) thread."""

    def __init__(self, printer: _Printer) -> None:
        from workbench.runtime.worker import WorkerHost

        self._printer = printer
        self._events: queue.Queue[Event] = queue.Queue()
        self.host = WorkerHost(self._events.put)

    def _wait(self, request_id: int) -> Any:
        from workbench.runtime.protocol import WorkerExited

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

    def load(self, source: str, device_map: dict, dtype: str | None) -> LoadSummary:
        return self._wait(self.host.load(source, device_map, dtype=dtype))

    def infer(
        self, prompt: str | None, max_new_tokens: int, profile: str | None
    ) -> InferenceResult:
        return self._wait(self.host.infer(prompt, max_new_tokens=max_new_tokens, profile=profile))

    def verify(self, prompt: str | None, mode: str) -> VerifyResult:
        return self._wait(self.host.verify(prompt, mode=mode))

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
            from tqdm import tqdm

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

    def inference(self, result: InferenceResult) -> None:
        if self.json_mode:
            return
        print()
        predicted = result.predicted
        if result.prompt_tokens == 0 and result.new_tokens == 0:  # a synthetic non-text input
            print(f"one forward on a synthetic input: {result.ttft_s * 1000:.1f} ms")
        else:
            print(
                f"{result.new_tokens} tokens from a {result.prompt_tokens}-token prompt: "
                f"{result.tokens_per_s:.2f} tokens/s, "
                f"time to first token {result.ttft_s * 1000:.1f} ms"
            )
        if predicted:
            print(
                f"predicted: {predicted['tokens_per_s']:.2f} tokens/s, "
                f"time to first token {predicted['ttft_s'] * 1000:.1f} ms"
            )
        from workbench.runtime.telemetry import group_layers

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

    def verify(self, result: VerifyResult) -> None:
        if self.json_mode:
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


def _as_json(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
