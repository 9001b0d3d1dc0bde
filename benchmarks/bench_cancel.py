"""Cancel latency: how soon a cooperative cancel of a real load returns, in the worker and in
the window.

Sizes: a generated llama demo (``--params``, default 24M, fp16 stored in 2 shards) loaded as
float32 with every decoder layer on disk, so a load writes ~100 MB to its offload folder and
lasts long enough to be cancelled mid-way. No test hold: the loads are real.

Scenarios, each ``--repeats`` times, medians and maxima printed:

  worker mid-load   ``WorkerHost.cancel()`` once a progress report shows 0 < done < total, until
                    the load's ``Failed(kind="cancelled")`` arrives.  Target < 0.5 s.
  worker building   a cold worker (no preloaded imports) cancelled while it builds the empty
                    model, until its ``Failed`` arrives.  Target < 0.5 s.
  window mid-load   the Runtime panel's Cancel button clicked mid-load, until the controller
                    is no longer busy (the progress bar back at idle).  Target < 1.0 s.

The worker's figures are the baseline the window's add to (bridge, Qt signals, panel updates).
Each cancelled load is followed by a full load in the same worker, which must succeed (the
cancel left the worker usable, without a terminate).

Usage: python benchmarks/bench_cancel.py [--params 24M] [--repeats 3] [--skip window]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

WORKER_TARGET_S = 0.5
WINDOW_TARGET_S = 1.0
WAIT_S = 600.0

ALL_LAYERS_ON_DISK = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers": "disk",
    "model.norm": "cpu",
    "lm_head": "cpu",
}


class Events:
    """A host's events; ``wait_for`` blocks until one matches."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._cond = threading.Condition()

    def __call__(self, event: Any) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[Any], bool]) -> Any:
        with self._cond:
            seen = 0
            while True:
                for event in self.events[seen:]:
                    if predicate(event):
                        return event
                seen = len(self.events)
                if not self._cond.wait(WAIT_S):
                    raise RuntimeError(f"no matching event within {WAIT_S:.0f} s")

    def final(self, request_id: int) -> Any:
        return self.wait_for(
            lambda e: (
                type(e).__name__ in ("Result", "Failed")
                and getattr(e, "request_id", None) == request_id
            )
        )


def _mid_load(request_id: int) -> Callable[[Any], bool]:
    from workbench.runtime.protocol import Progress

    return lambda e: (
        isinstance(e, Progress)
        and e.request_id == request_id
        and e.phase == "loading"
        and 0 < e.bytes_done < e.bytes_total
    )


def _building(request_id: int) -> Callable[[Any], bool]:
    from workbench.runtime.protocol import Phase

    return lambda e: isinstance(e, Phase) and e.request_id == request_id and e.phase == "building"


def _check_cancelled(final: Any) -> None:
    if type(final).__name__ != "Failed" or final.kind != "cancelled":
        raise RuntimeError(f"the load was not cancelled: {final!r}")


def worker_cancel_s(demo: Path, root: Path, *, building: bool) -> float:
    """Seconds from ``cancel()`` to the cancelled load's final event (one fresh worker)."""
    from workbench.runtime.worker import WorkerHost

    events = Events()
    host = WorkerHost(events, offload_root=root / "offload", preload_imports=not building)
    try:
        load_id = host.load(demo, ALL_LAYERS_ON_DISK, dtype="float32")
        events.wait_for(_building(load_id) if building else _mid_load(load_id))
        start_s = time.perf_counter()
        if not host.cancel():
            raise RuntimeError("cancel() found no running job")
        final = events.final(load_id)
        cancel_s = time.perf_counter() - start_s
        _check_cancelled(final)
        again = host.load(demo, {"": "cpu"}, dtype="float32")
        if type(events.final(again)).__name__ != "Result" or not host.is_alive():
            raise RuntimeError("the worker did not load again after the cancel")
        return cancel_s
    finally:
        host.shutdown()


def window_cancel_s(demo: Path, repeats: int) -> list[float]:
    """Seconds from the Cancel click to the controller's idle state, in a real ``MainWindow``
    (to within the 20 ms poll of ``run_event_loop_until``)."""
    from PySide6.QtWidgets import QApplication

    from workbench.gui.main_window import MainWindow
    from workbench.gui.workers import run_event_loop_until
    from workbench.models import open_model

    app = QApplication.instance() or QApplication(sys.argv)
    window = MainWindow(autosave=False)
    window.show()
    panels = window.runtime_panels
    window.set_opened(str(demo), open_model(str(demo)), dict(ALL_LAYERS_ON_DISK))
    window.session.set_dtype("float32")
    panels.bridge.start()
    run_event_loop_until(lambda: panels.bridge.state == "idle", WAIT_S)  # spawn + imports
    seconds = []
    mid: list[Any] = []

    def on_progress(event: Any) -> None:
        if 0 < event.bytes_done < event.bytes_total:
            mid.append(event)

    panels.bridge.progress.connect(on_progress)
    try:
        for _ in range(repeats):
            mid.clear()
            panels.load_action.trigger()
            if not run_event_loop_until(lambda: bool(mid) or not panels.controller.busy, WAIT_S):
                raise RuntimeError("the load never reported progress")
            if not mid:
                raise RuntimeError("the load ended before it could be cancelled; use --params")
            start_s = time.perf_counter()
            panels.progress_widget.cancel_button.click()
            run_event_loop_until(lambda: not panels.controller.busy, WAIT_S)
            seconds.append(time.perf_counter() - start_s)
            if panels.controller.loaded or panels.controller.errors:
                raise RuntimeError(
                    f"the cancel did not leave the window idle: {panels.controller.errors}"
                )
    finally:
        panels.bridge.progress.disconnect(on_progress)
        window.close()
        app.processEvents()
    return seconds


def report(name: str, seconds: list[float], target_s: float) -> None:
    worst = max(seconds)
    print(
        f"{name:<16} median {statistics.median(seconds) * 1e3:6.0f} ms  max {worst * 1e3:6.0f} ms  "
        f"target < {target_s * 1e3:.0f} ms: {'met' if worst < target_s else 'NOT MET'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--params", default="24M", help="demo size (default 24M)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", default="", help="comma-separated: mid-load,building,window")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    from workbench.models import make_demo

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        demo = make_demo(root / "demo", arch="llama", params=args.params, shards=2)
        print(f"demo {args.params} llama, float32 load, layers on disk, {args.repeats} repeats")
        if "mid-load" not in skip:
            runs = [worker_cancel_s(demo, root, building=False) for _ in range(args.repeats)]
            report("worker mid-load", runs, WORKER_TARGET_S)
        if "building" not in skip:
            runs = [worker_cancel_s(demo, root, building=True) for _ in range(args.repeats)]
            report("worker building", runs, WORKER_TARGET_S)
        if "window" not in skip:
            report("window mid-load", window_cancel_s(demo, args.repeats), WINDOW_TARGET_S)


if __name__ == "__main__":
    main()
