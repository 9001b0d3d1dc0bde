"""Latency the user feels: click-to-loaded and click-to-first-token, cold worker vs warm worker.

Sizes: the random-weight 60M-parameter llama demo (``make_demo(arch="llama", params="60M")``,
the size ``workbench --demo`` made: 60.1M parameters, 115 MiB as stored, 2 shards), generated
once under ``~/.cache/workbench-bench/click-demo-60m``, loaded along ``{"": "cpu"}`` as stored.

Scenarios, alternated round by round in this one process, each round in a fresh ``MainWindow``
(offscreen) with a fresh worker process:

  cold   before: the worker process is spawned by the click on Load & dispatch, so the click
         pays spawn + imports (torch, transformers, the engine) + the load
  warm   after: the window starts the worker as soon as the model is open
         (``RuntimePanels.warm_on_open``); the user clicks once it is ready ("worker ready" in
         the status bar), so the click pays only the load

Per round: trigger Load & dispatch, time to ``load_finished`` (click-to-loaded) and the load's
own ``load_s`` (what the worker spent loading); then click Run (8 new tokens) and time to the
first ``TokenStreamed`` (click-to-first-token, the model already loaded) and to the run's end.
For the warm rounds the warm-up itself (start to ``WorkerReady``) is printed too: it is the time
the user no longer waits for. Medians over ``--rounds`` and the cold/warm ratios are printed.

Usage: python benchmarks/bench_click_latency.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

CACHE = Path.home() / ".cache" / "workbench-bench" / "click-demo-60m"
TIMEOUT_S = 600.0


def ensure_demo() -> Path:
    from workbench.models import make_demo

    if (CACHE / "config.json").is_file():
        return CACHE
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    return Path(make_demo(CACHE, arch="llama", params="60M", shards=2, seed=0))


def one_round(folder: Path, warm: bool) -> dict[str, float]:
    from PySide6.QtWidgets import QApplication

    from workbench.gui.commands import push_plan
    from workbench.gui.main_window import MainWindow
    from workbench.gui.workers import run_event_loop_until

    app = QApplication.instance()
    window = MainWindow(autosave=False)
    window.resize(1400, 900)
    window.show()
    panels = window.runtime_panels
    panels.warm_on_open = warm
    panels.controller.error_presenter = lambda *args: print("error:", *args, file=sys.stderr)
    marks: dict[str, float] = {}
    panels.bridge.ready.connect(lambda _e: marks.setdefault("ready", time.perf_counter()))
    panels.controller.load_finished.connect(
        lambda s: marks.update(loaded=time.perf_counter(), load_s=s.load_s)
    )
    panels.bridge.token.connect(lambda _e: marks.setdefault("token", time.perf_counter()))
    panels.inference_panel.run_finished.connect(
        lambda _r: marks.setdefault("run", time.perf_counter())
    )
    try:
        opened_s = time.perf_counter()
        window.open_source(str(folder))
        assert run_event_loop_until(lambda: window.session.tree is not None, TIMEOUT_S)
        push_plan(window.undo_stack, window.session, {"": "cpu"}, strategy="auto")
        if warm:
            assert run_event_loop_until(lambda: "ready" in marks, TIMEOUT_S), "never warm"
        assert run_event_loop_until(panels.load_action.isEnabled, 60)
        click_s = time.perf_counter()
        panels.load_action.trigger()
        assert run_event_loop_until(lambda: "loaded" in marks, TIMEOUT_S), "never loaded"
        panels.inference_panel.max_tokens_spin.setValue(8)
        assert run_event_loop_until(panels.inference_panel.run_button.isEnabled, 60)
        run_s = time.perf_counter()
        panels.inference_panel.run_button.click()
        assert run_event_loop_until(lambda: "run" in marks, TIMEOUT_S), "the run never ended"
        row = {
            "click_to_loaded_s": marks["loaded"] - click_s,
            "load_s": marks["load_s"],
            "click_to_first_token_s": marks.get("token", marks["run"]) - run_s,
            "click_to_run_end_s": marks["run"] - run_s,
        }
        if warm:
            row["warmup_s"] = marks["ready"] - opened_s
        return row
    finally:
        window.session.mark_clean()
        window.close()
        app.processEvents()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv)  # noqa: F841  (kept alive)
    folder = ensure_demo()
    rows: dict[str, list[dict[str, float]]] = {"cold": [], "warm": []}
    for k in range(args.rounds):
        for scenario in ("cold", "warm"):
            row = one_round(folder, warm=scenario == "warm")
            rows[scenario].append(row)
            figures = ", ".join(f"{name} {value:.2f}" for name, value in row.items())
            print(f"round {k + 1} {scenario}: {figures}", flush=True)
    print(f"\n{folder} (60M llama, as stored, map {{'': 'cpu'}}), medians of {args.rounds}:")
    names = ("click_to_loaded_s", "load_s", "click_to_first_token_s", "click_to_run_end_s")
    print(f"{'':24} {'cold (before)':>14} {'warm (after)':>14} {'cold/warm':>10}")
    for name in names:
        cold = statistics.median(r[name] for r in rows["cold"])
        warm = statistics.median(r[name] for r in rows["warm"])
        print(f"{name:24} {cold:14.2f} {warm:14.2f} {cold / warm:10.2f}")
    warmup = statistics.median(r["warmup_s"] for r in rows["warm"])
    print(f"{'warm-up (open->ready)':24} {'':14} {warmup:14.2f}   (in the background)")


if __name__ == "__main__":
    main()
