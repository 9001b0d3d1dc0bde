"""Worker overhead: load time and per-token time through the worker process vs in process,
and the memory sampler's CPU cost at 10 Hz.

    python benchmarks/bench_worker.py [--params 20M] [--tokens 16] [--repeats 5]
        [--device cpu|cuda] [--offload disk|cpu|none] [--sampler-s 5]

Sizes: a generated llama demo (``--params``, fp16 stored, loaded as float32 on CPU / float16 on
CUDA, 2 shards). Map: layer 0 and the rest on the execution device, the second half of the
layers offloaded (``--offload``). Both sides run the same ``JobRunner`` code in this script;
the worker side adds process spawn, pickled events, the event pipe and the reader thread.
Per-token time is measured here, on the receiving side: the gaps between ``TokenStreamed``
events as this script's callback gets them, so the worker's pipe, reader thread and callback
are counted. Both sides get a warm-up load and inference before the measured runs. Ratios > 1
mean the worker is slower.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path


def make_model(params: str, root: Path) -> tuple[Path, int]:
    from workbench.models import make_demo

    folder = make_demo(root / "demo", arch="llama", params=params, shards=2)
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    return folder, layers


def device_map_for(layers: int, device: str, offload: str) -> dict[str, object]:
    exec_dev: object = 0 if device == "cuda" else "cpu"
    device_map: dict[str, object] = {"model.embed_tokens": exec_dev, "model.rotary_emb": exec_dev}
    for i in range(layers):
        offloaded = offload != "none" and i >= layers // 2
        device_map[f"model.layers.{i}"] = offload if offloaded else exec_dev
    device_map |= {"model.norm": exec_dev, "lm_head": exec_dev}
    return device_map


class TokenClock:
    """Records when each ``TokenStreamed`` event reaches the receiving side."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []

    def __call__(self, event: object) -> None:
        from workbench.runtime.protocol import TokenStreamed

        if isinstance(event, TokenStreamed):
            self.arrivals.append(time.perf_counter())

    def per_token_s(self) -> float:
        """Seconds between token arrivals after the first (the steady state)."""
        times, self.arrivals = self.arrivals, []
        if len(times) < 2:
            raise RuntimeError(f"need at least 2 streamed tokens, got {len(times)}")
        return (times[-1] - times[0]) / (len(times) - 1)


class InProcess:
    """The baseline: the same ``JobRunner`` on this thread."""

    def __init__(self) -> None:
        from workbench.runtime.jobs import JobRunner

        self.clock = TokenClock()
        self.runner = JobRunner(self.clock)
        self._offload = tempfile.TemporaryDirectory()
        self._next = 0

    def _run(self, request: object) -> object:
        from workbench.big_modeling.progress import CancelToken
        from workbench.runtime.protocol import Result

        final = self.runner.run(request, CancelToken())  # type: ignore[arg-type]
        assert isinstance(final, Result), final
        return final.value

    def load(self, folder: Path, device_map: dict, dtype: str) -> None:
        from workbench.runtime.protocol import Load

        self._next += 1
        self._run(Load(self._next, str(folder), device_map, dtype, self._offload.name))

    def infer(self, tokens: int) -> object:
        from workbench.runtime.protocol import Infer

        self._next += 1
        return self._run(Infer(self._next, "The planner", tokens))

    def close(self) -> None:
        self.runner.close()
        self._offload.cleanup()


class ThroughWorker:
    """Ours: the same jobs in the worker process, results waited for on this thread."""

    def __init__(self) -> None:
        from workbench.runtime.protocol import Failed, Result
        from workbench.runtime.worker import WorkerHost

        self._finals: queue.Queue = queue.Queue()
        self.clock = TokenClock()

        def on_event(event: object) -> None:
            self.clock(event)
            if isinstance(event, (Result, Failed)):
                self._finals.put(event)

        self.host = WorkerHost(on_event)

    def _wait(self, request_id: int) -> object:
        from workbench.runtime.protocol import Result

        while True:
            event = self._finals.get(timeout=600)
            if event.request_id == request_id:
                assert isinstance(event, Result), event
                return event.value

    def load(self, folder: Path, device_map: dict, dtype: str) -> None:
        self._wait(self.host.load(folder, device_map, dtype=dtype))

    def infer(self, tokens: int) -> object:
        return self._wait(self.host.infer("The planner", max_new_tokens=tokens))

    def close(self) -> None:
        self.host.shutdown()


def measure(folder: Path, device_map: dict, dtype: str, tokens: int, repeats: int) -> dict:
    """Alternate baseline and worker runs so machine-load drift hits both sides alike."""
    sides = {"in process": InProcess(), "worker": ThroughWorker()}
    figures: dict[str, dict[str, list[float]]] = {
        k: {"load_s": [], "per_token_s": []} for k in sides
    }
    try:
        start = time.perf_counter()
        sides["worker"].load(folder, device_map, dtype)
        cold_s = time.perf_counter() - start  # spawn + imports + first load
        for side in sides.values():  # warm-up: imports, allocator, kernels, page cache
            side.load(folder, device_map, dtype)
            side.infer(tokens)
            side.clock.arrivals.clear()
        for _ in range(repeats):
            for name, side in sides.items():
                start = time.perf_counter()
                side.load(folder, device_map, dtype)
                figures[name]["load_s"].append(time.perf_counter() - start)
                side.infer(tokens)
                figures[name]["per_token_s"].append(side.clock.per_token_s())
    finally:
        for side in sides.values():
            side.close()
    out = {name: {k: statistics.median(v) for k, v in f.items()} for name, f in figures.items()}
    out["worker"]["cold_load_s"] = cold_s
    return out


def sampler_cost(seconds: float, rate_hz: float = 10.0) -> dict:
    """CPU seconds per wall second of this process with and without the sampler running."""
    from workbench.runtime.telemetry import MemorySampler

    idle_stop = threading.Event()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    idle_stop.wait(seconds)
    idle = (time.process_time() - cpu0) / (time.perf_counter() - wall0)

    sink: list = []
    sampler = MemorySampler(sink.append, rate_hz=rate_hz)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    sampler.start()
    threading.Event().wait(seconds)
    sampler.stop()
    busy = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    samples = len(sink)
    return {
        "idle_cpu_fraction": idle,
        "sampler_cpu_fraction": busy,
        "samples": samples,
        "cpu_ms_per_sample": (busy - idle) * seconds / max(samples, 1) * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="20M")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--offload", default="disk", choices=("disk", "cpu", "none"))
    parser.add_argument("--sampler-s", type=float, default=5.0)
    args = parser.parse_args()
    if args.tokens < 2 or args.repeats < 1:
        parser.error(
            "--tokens must be >= 2 (per-token time is measured between tokens), --repeats >= 1"
        )
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("--device cuda: no CUDA device here", file=sys.stderr)
            return 2
    if args.device == "cpu" and args.offload == "cpu":
        args.offload = "none"
    dtype = "float16" if args.device == "cuda" else "float32"
    with tempfile.TemporaryDirectory() as root:
        folder, layers = make_model(args.params, Path(root))
        device_map = device_map_for(layers, args.device, args.offload)
        print(
            f"model: llama demo {args.params} ({layers} layers), {dtype}, device {args.device}, "
            f"offload {args.offload} for layers {layers // 2}..{layers - 1}; "
            f"{args.tokens} new tokens, median of {args.repeats}"
        )
        both = measure(folder, device_map, dtype, args.tokens, args.repeats)
    base, ours = both["in process"], both["worker"]
    print(f"{'':28}{'in process':>14}{'worker':>14}{'ratio':>8}")
    for key, label in (("load_s", "load (warm) s"), ("per_token_s", "decode s/token (arrival)")):
        print(f"{label:28}{base[key]:14.4f}{ours[key]:14.4f}{ours[key] / base[key]:8.2f}")
    print(f"{'first load, cold worker s':28}{'':14}{ours['cold_load_s']:14.4f}")
    cost = sampler_cost(args.sampler_s)
    print(
        f"memory sampler at 10 Hz for {args.sampler_s:g} s: {cost['samples']} samples, "
        f"process CPU {cost['sampler_cpu_fraction'] * 100:.2f}% of a core "
        f"(idle baseline {cost['idle_cpu_fraction'] * 100:.2f}%), "
        f"{cost['cpu_ms_per_sample']:.3f} CPU ms per sample"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
