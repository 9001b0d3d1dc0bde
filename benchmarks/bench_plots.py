"""The live plots on their own: refresh rate while fed, CPU cost at rest, cost per forward.

Real widgets (offscreen Qt), fed plain numbers, no worker. Three measurements:

  refresh     a ``MemoryPlot`` (800 x 400, 10 Hz timer) fed 50 samples/s for ``--fed-s``
              seconds: refreshes per second.  Target >= 10 Hz.
  at rest     a ``MemoryPlot`` and a ``TransferPlot`` (1200 x 400) with one minute of history,
              fed the worker's idle telemetry (10 samples/s, each a pixel further right), for
              ``--rest-s`` seconds after the first paints settled: redraws per second (must be
              >= 7, or the figure measured no work) and this process's CPU time as a share of
              one core; the same span with the plot timers stopped is the baseline, run right
              after.  Target: the plots' share (with minus without) < 5% of one core.
  per forward ``TransferPlot.add_forward`` with 30 and with 3000 layers (64 steps kept; min of 3
              rounds of 100 forwards each): 100x the layers should cost ~100-400x (linear work
              plus caches); a list search per layer would cost ~10000x.  Target ratio < 1000.

``bench_gui_load_latency.py`` measures the at-rest figure again inside the real window after a
load.

Usage: python benchmarks/bench_plots.py [--fed-s 3] [--rest-s 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QEventLoop, QTimer  # after the platform is chosen
from PySide6.QtWidgets import QApplication

from workbench.gui.plots import GIB
from workbench.gui.plots.memory_plot import MemoryPlot
from workbench.gui.plots.transfer_plot import TransferPlot
from workbench.runtime.protocol import LayerTiming

REFRESH_TARGET_HZ = 10.0
REST_TARGET_SHARE = 0.05
REST_MIN_REDRAWS_PER_S = 7.0
FORWARD_TARGET_RATIO = 1000.0


def run_loop(seconds: float) -> tuple[float, float]:
    """Run the event loop for ``seconds``; return (wall s, this process's CPU s)."""
    loop = QEventLoop()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    loop.exec()
    return time.perf_counter() - wall0, time.process_time() - cpu0


def refresh_hz(fed_s: float) -> float:
    plot = MemoryPlot()
    plot.resize(800, 400)
    plot.show()
    feeder = QTimer()
    feeder.setInterval(20)  # 50 samples/s
    feeder.timeout.connect(lambda: plot.append_sample(time.monotonic(), {"worker rss": GIB}))
    feeder.start()
    run_loop(0.5)  # the first paint is not the steady state
    count = plot.refresh_count
    wall_s, _ = run_loop(fed_s)
    feeder.stop()
    plot.close()
    return (plot.refresh_count - count) / wall_s


def rest_cost(rest_s: float) -> tuple[float, float, float]:
    """(redraws/s, CPU share with the plots' timers running, CPU share with them stopped)."""
    memory_plot, transfer = MemoryPlot(refresh_hz=10.0), TransferPlot()
    for widget in (memory_plot, transfer):
        widget.resize(1200, 400)
        widget.show()
    memory_plot.set_budgets({"cpu": 16 * GIB})
    clock = {"t_s": 0.0}

    def sample() -> None:
        clock["t_s"] += 0.1
        k = round(clock["t_s"] * 10)
        memory_plot.append_sample(
            clock["t_s"], {"worker rss": 2 * GIB + (k % 7) * 4096, "system available": 9 * GIB}
        )

    for _ in range(600):  # one minute of history
        sample()
    transfer.add_forward([LayerTiming(f"l{i}", 1e-3, 1e-3, 10**6, "cpu") for i in range(32)])
    feeder = QTimer()
    feeder.setInterval(100)  # the worker's telemetry rate
    feeder.timeout.connect(sample)
    feeder.start()
    run_loop(0.5)  # the first paint of both plots is not "at rest"
    count = memory_plot.refresh_count
    wall_s, cpu_s = run_loop(rest_s)
    redraws = (memory_plot.refresh_count - count) / wall_s
    memory_plot.timer.stop()
    transfer.timer.stop()
    base_wall_s, base_cpu_s = run_loop(rest_s)
    feeder.stop()
    for widget in (memory_plot, transfer):
        widget.close()
    return redraws, cpu_s / wall_s, base_cpu_s / base_wall_s


def seconds_per_forward(layers: int) -> float:
    plot = TransferPlot(max_steps=64)
    names = [f"model.layers.{i}" for i in range(layers)]
    plot.set_layers(names)
    rows = [LayerTiming(name, 1e-3, 1e-3, 10**6, "disk") for name in names]
    start = time.perf_counter()
    for _ in range(100):
        plot.add_forward(rows)
    elapsed = (time.perf_counter() - start) / 100
    if plot.heatmap().shape != (64, layers):
        raise RuntimeError(f"heatmap shape {plot.heatmap().shape}, expected (64, {layers})")
    plot.deleteLater()
    return elapsed


def verdict(met: bool) -> str:
    return "met" if met else "NOT MET"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fed-s", type=float, default=3.0)
    parser.add_argument("--rest-s", type=float, default=3.0)
    args = parser.parse_args()
    app = QApplication.instance() or QApplication(sys.argv)

    hz = refresh_hz(args.fed_s)
    print(
        f"refresh while fed 50 samples/s: {hz:.1f} Hz "
        f"(target >= {REFRESH_TARGET_HZ:.0f} Hz: {verdict(hz >= REFRESH_TARGET_HZ)})"
    )

    redraws, with_timers, without = rest_cost(args.rest_s)
    share = max(0.0, with_timers - without)
    print(
        f"at rest: {redraws:.1f} redraws/s (must be >= {REST_MIN_REDRAWS_PER_S:.0f}: "
        f"{verdict(redraws >= REST_MIN_REDRAWS_PER_S)}); process {with_timers:.1%} of one core "
        f"with the plot timers, {without:.1%} without; the plots' share {share:.1%} "
        f"(target < {REST_TARGET_SHARE:.0%}: {verdict(share < REST_TARGET_SHARE)})"
    )

    seconds_per_forward(30)  # warm up
    small = min(seconds_per_forward(30) for _ in range(3))
    large = min(seconds_per_forward(3000) for _ in range(3))
    ratio = large / small
    print(
        f"per forward: 30 layers {small * 1e6:.0f} us, 3000 layers {large * 1e6:.0f} us, "
        f"ratio {ratio:.0f}x (target < {FORWARD_TARGET_RATIO:.0f}x: "
        f"{verdict(ratio < FORWARD_TARGET_RATIO)})"
    )
    app.processEvents()


if __name__ == "__main__":
    main()
