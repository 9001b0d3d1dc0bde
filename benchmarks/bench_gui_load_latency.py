"""GUI responsiveness while a ~2 GB checkpoint loads, and the plots' CPU cost at rest.

Sizes: the Llama-shaped fp16 checkpoint of ``bench_loading.py`` (hidden 2048, 17 layers, vocab
32000: 1.005 B parameters = 2.01 GB in 5 shards), generated once under
``~/.cache/workbench-bench/llama-2g`` (a ``config.json`` is written beside it, in a sibling
folder of hard links, ``llama-2g-gui``).

A 5 ms ``Qt.PreciseTimer`` on the GUI thread records how late each tick fires (gap - 5 ms) in
the real ``MainWindow`` with the runtime panels shown (the Memory tab visible, so the plot
repaints at 10 Hz). Scenarios, run side by side in this one process:

  idle        the window at rest, worker stopped (the floor)
  gui-thread  the engine's ``load_checkpoint_and_dispatch`` called on the GUI thread (naive)
  py-thread   the same call on a Python thread in the GUI process (GIL contention)
  worker      ours: Load & dispatch, worker process + bridge + progress bar + live plots

Target: worker p99 lateness < 50 ms. Then, with the model loaded and the worker sampling memory
at 10 Hz, the plots' CPU cost at rest (< 5% of one core): the GUI process's CPU time with the
Memory plot refreshing at 10 Hz minus the same with its timer stopped, rounds of 3 s
interleaved, medians (the whole process's figures and the redraws per second are printed too).

Usage: python benchmarks/bench_gui_load_latency.py [--skip gui-thread,py-thread] [--device cuda]
(``--device cuda`` loads to ``{"": 0}`` in every scenario; Qt must be available.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from workbench.gui.workers import run_event_loop_until

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np

HERE = Path(__file__).resolve().parent
TICK_MS = 5.0
TARGET_P99_MS = 50.0


def _bench_loading():
    spec = importlib.util.spec_from_file_location("bench_loading", HERE / "bench_loading.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ensure_gui_checkpoint() -> Path:
    """The 2 GB checkpoint plus its config.json, as a folder the app can open."""
    loading = _bench_loading()
    shards = loading.ensure_checkpoint("2g")
    folder = shards.parent / "llama-2g-gui"
    if (folder / "config.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for path in shards.iterdir():
        target = folder / path.name
        if not target.exists():
            os.link(path, target)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "torch_dtype": "float16",
        **loading.SIZES["2g"]["config"],
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


REST_ROUNDS = 3
REST_ROUND_S = 3.0


def rest_cpu_share(seconds: float) -> float:
    """This process's CPU time over ``seconds`` of event loop, as a share of one core.

    The loop quits on one single-shot timer: no polling of our own inflates the figure.
    """
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    loop.exec()
    return (time.process_time() - cpu0) / (time.perf_counter() - wall0)


class LatencyProbe:
    """A precise 5 ms timer; ``late_ms`` holds how late each tick fired."""

    def __init__(self) -> None:
        from PySide6.QtCore import Qt, QTimer

        self.timer = QTimer()
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(int(TICK_MS))
        self.timer.timeout.connect(self._on_timer_timeout)
        self.late_ms: list[float] = []
        self.tick_s: list[float] = []
        self._last_s = 0.0

    def start(self) -> None:
        self.late_ms = []
        self.tick_s = []
        self._last_s = time.perf_counter()
        self.timer.start()

    def stop(self) -> np.ndarray:
        self.timer.stop()
        self._on_timer_timeout()  # a freeze still running at the end counts too
        return np.array(self.late_ms)

    def _on_timer_timeout(self) -> None:
        now = time.perf_counter()
        self.late_ms.append(max(0.0, (now - self._last_s) * 1e3 - TICK_MS))
        self.tick_s.append(now)
        self._last_s = now


def stats(late_ms: np.ndarray) -> dict[str, float]:
    return {
        "ticks": float(len(late_ms)),
        "p50": float(np.percentile(late_ms, 50)),
        "p99": float(np.percentile(late_ms, 99)),
        "max": float(late_ms.max()),
    }


def in_process_load(
    folder: Path, device_map: dict, dtype: str | None, on_thread: bool, probe: LatencyProbe
) -> tuple[np.ndarray, float]:
    from workbench.big_modeling import load_checkpoint_and_dispatch
    from workbench.models import open_model

    opened = open_model(str(folder))
    done: list[object] = []

    def work() -> None:
        model = load_checkpoint_and_dispatch(
            opened.model, str(folder), device_map=device_map, dtype=dtype
        )
        done.append(model)

    probe.start()
    start_s = time.perf_counter()
    if on_thread:
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        run_event_loop_until(lambda: bool(done), 1800)
        thread.join()
    else:
        run_event_loop_until(lambda: True, 0.2)  # a few ticks before the freeze
        work()
    load_s = time.perf_counter() - start_s
    late = probe.stop()
    done.clear()
    return late, load_s


def _label(event: object) -> str:
    name = type(event).__name__
    detail = getattr(event, "phase", None) or getattr(event, "state", None) or ""
    return f"{name}:{detail}" if detail else name


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--skip", default="", help="comma-separated scenarios to skip")
    parser.add_argument("--idle-s", type=float, default=3.0)
    parser.add_argument(
        "--dtype",
        default="float32",
        help="load dtype; the default fp16 -> fp32 conversion makes every byte be read and copied "
        "(a plain fp16 load to cpu is memory-mapped, so nearly free); 'none' keeps fp16",
    )
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    device_map = {"": 0} if args.device == "cuda" else {"": "cpu"}
    dtype = None if args.dtype == "none" else args.dtype

    folder = ensure_gui_checkpoint()
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv)
    from workbench.gui.main_window import MainWindow
    from workbench.models import open_model

    window = MainWindow(autosave=False)
    window.resize(1400, 900)
    window.show()
    panels = window.runtime_panels
    assert panels is not None, "the runtime panels did not install"
    window.bottom_tabs.setCurrentWidget(panels.memory_plot)
    window.set_opened(str(folder), open_model(str(folder)), device_map)
    window.session.set_dtype(dtype)
    nbytes = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    print(
        f"checkpoint: {folder} ({nbytes / 1e9:.2f} GB fp16), map {device_map}, dtype {dtype}, tick {TICK_MS:.0f} ms"
    )

    probe = LatencyProbe()
    results: dict[str, dict[str, float]] = {}
    probe.start()
    run_event_loop_until(lambda: False, args.idle_s)
    results["idle"] = stats(probe.stop())

    for name, on_thread in (("gui-thread", False), ("py-thread", True)):
        if name in skip:
            continue
        late, load_s = in_process_load(folder, device_map, dtype, on_thread, probe)
        results[name] = {**stats(late), "load_s": load_s}

    if "worker" not in skip:
        panels.bridge.start()
        run_event_loop_until(
            lambda: panels.bridge.state == "idle", 300
        )  # spawn + imports: not the load
        timeline: list[tuple[float, str]] = []
        panels.bridge.event.connect(lambda ev: timeline.append((time.perf_counter(), _label(ev))))
        probe.start()
        start_s = time.perf_counter()
        panels.load_action.trigger()
        trigger_ms = (time.perf_counter() - start_s) * 1e3
        ok = run_event_loop_until(
            lambda: panels.controller.loaded or bool(panels.controller.errors), 1800
        )
        load_s = time.perf_counter() - start_s
        late = probe.stop()
        results["worker"] = {**stats(late), "load_s": load_s}
        print(f"  Load & dispatch click handled in {trigger_ms:.0f} ms")
        for index in np.argsort(late)[-3:][::-1]:  # the worst freezes and what preceded them
            end_s = probe.tick_s[index]
            before = [label for t, label in timeline if t <= end_s][-3:]
            print(
                f"  freeze {late[index]:.0f} ms ending {end_s - start_s:.2f} s into the load, after {before}"
            )
        if not ok or panels.controller.errors:
            print(f"worker load failed: {panels.controller.errors}")

        run_event_loop_until(lambda: False, 1.0)  # let the last paints settle
        plot = panels.memory_plot
        redraws0, rest0_s = plot.refresh_count, time.perf_counter()
        on, off = [], []
        for _ in range(REST_ROUNDS):  # plots redrawing vs their timer stopped, interleaved
            on.append(rest_cpu_share(REST_ROUND_S))
            plot.timer.stop()
            off.append(rest_cpu_share(REST_ROUND_S))
            plot.timer.start()
        rest_redraws = (plot.refresh_count - redraws0) / (time.perf_counter() - rest0_s) * 2
        rest_cpu = statistics.median(on)
        plots_cpu = max(0.0, rest_cpu - statistics.median(off))
        samples = plot.sample_count
        print(
            f"at rest, model loaded, {samples} memory samples, plot timer "
            f"{1000 / plot.timer.interval():.0f} Hz, {rest_redraws:.1f} redraws/s, medians of "
            f"{REST_ROUNDS} x {REST_ROUND_S:.0f} s: GUI process {rest_cpu:.1%} of one core "
            f"with the plots redrawing, {statistics.median(off):.1%} with their timer stopped"
        )
        print(
            f"plots' CPU cost at rest: {plots_cpu:.1%} of one core "
            f"({'PASS' if plots_cpu < 0.05 else 'FAIL'} < 5%)"
        )
    base = results["idle"]["p99"] or 1e-3
    print(
        f"{'scenario':<11} {'ticks':>6} {'p50 ms':>8} {'p99 ms':>9} {'max ms':>9} {'load s':>7} {'p99/idle':>9}"
    )
    for name, row in results.items():
        print(
            f"{name:<11} {row['ticks']:6.0f} {row['p50']:8.2f} {row['p99']:9.2f} {row['max']:9.1f} "
            f"{row.get('load_s', float('nan')):7.1f} {row['p99'] / base:9.1f}x"
        )
    if "worker" in results:
        p99 = results["worker"]["p99"]
        print(
            f"worker p99 {p99:.1f} ms: {'PASS' if p99 < TARGET_P99_MS else 'FAIL'} (target < {TARGET_P99_MS:.0f} ms)"
        )
        for name in ("gui-thread", "py-thread"):
            if name in results:
                print(f"  {name} p99 / worker p99 = {results[name]['p99'] / max(p99, 1e-3):.0f}x")
    window.close()
    app.processEvents()


if __name__ == "__main__":
    main()
