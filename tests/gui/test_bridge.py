"""WorkerBridge: events from a foreign thread arrive as Qt signals, in order, on the GUI thread."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
from PySide6.QtCore import QThread

from workbench.gui.bridge import WorkerBridge
from workbench.runtime.protocol import (
    Failed,
    Log,
    Phase,
    Progress,
    Result,
    StateChanged,
    TelemetrySample,
    WorkerExited,
)

pytestmark = pytest.mark.gui


class ThreadedHost:
    """A host whose events come from a real background thread, like the reader thread."""

    def __init__(self, on_event: Callable[[Any], None]) -> None:
        self.on_event = on_event
        self.state = "stopped"
        self.calls: list[tuple] = []

    def play(self, events: list[Any]) -> threading.Thread:
        thread = threading.Thread(target=lambda: [self.on_event(e) for e in events])
        thread.start()
        return thread

    def start(self) -> None:
        self.calls.append(("start",))

    def load(self, source, device_map, *, dtype=None, options=None) -> int:
        self.calls.append(("load", source, dict(device_map), dtype, options))
        return 7

    def cancel(self) -> bool:
        self.calls.append(("cancel",))
        return True

    def shutdown(self, timeout_s: float = 5.0) -> None:
        self.calls.append(("shutdown",))


@pytest.fixture
def bridge(qtbot):
    bridge = WorkerBridge(host_factory=ThreadedHost)
    yield bridge
    bridge.shutdown()


def test_events_from_a_thread_arrive_in_order_on_the_gui_thread(qtbot, bridge) -> None:
    seen: list[tuple[str, bool]] = []
    gui_thread = QThread.currentThread()
    bridge.event.connect(
        lambda ev: seen.append((type(ev).__name__, QThread.currentThread() is gui_thread))
    )
    events = [
        StateChanged("loading", "idle"),
        Phase(7, "opening"),
        Progress(7, 10, 100),
        Log(20, "hello", 7),
        Phase(7, "ready"),
        Result(7, "load", None),
    ]
    bridge.start()
    with qtbot.waitSignal(bridge.result, timeout=5000):
        bridge.host.play(events).join()
    assert seen == [
        ("StateChanged", True),
        ("Phase", True),
        ("Progress", True),
        ("Log", True),
        ("Phase", True),
        ("Result", True),
    ]


def test_typed_signals_carry_the_event(qtbot, bridge) -> None:
    got: list[tuple[str, Any]] = []
    for name in ("telemetry", "failed", "exited", "state_changed"):
        getattr(bridge, name).connect(lambda arg, name=name: got.append((name, arg)))
    bridge.start()
    sample = TelemetrySample(1.0, 100, 200)
    failed = Failed(3, "boom", kind="bad_input", job="load")
    exited = WorkerExited(None, 9, False, "killed")
    with qtbot.waitSignal(bridge.state_changed, timeout=5000):
        bridge.host.play([sample, failed, exited, StateChanged("stopped", "idle")]).join()
    assert got == [
        ("telemetry", sample),
        ("failed", failed),
        ("exited", exited),
        ("state_changed", "stopped"),
    ]


def test_progress_is_throttled_but_the_last_one_before_result_survives(qtbot, bridge) -> None:
    progress: list[int] = []
    bridge.progress.connect(lambda ev: progress.append(ev.bytes_done))
    bridge.start()
    burst = [Progress(7, done, 1000) for done in range(1, 1001)]
    with qtbot.waitSignal(bridge.result, timeout=5000):
        bridge.host.play([*burst, Result(7, "load", None)]).join()
    assert progress[-1] == 1000  # flushed before the Result
    assert progress == sorted(progress)  # never out of order
    assert len(progress) < 50  # 1000 reports folded into a few (20 Hz)


def test_a_lone_progress_is_delivered_by_the_throttle_timer(qtbot, bridge) -> None:
    bridge.start()
    with qtbot.waitSignal(bridge.progress, timeout=5000):
        bridge.host.play([Progress(7, 1, 10)]).join()
    with qtbot.waitSignal(bridge.progress, timeout=5000) as blocker:  # within the 50 ms window
        bridge.host.play([Progress(7, 2, 10)]).join()
    assert blocker.args[0].bytes_done == 2


def test_requests_go_to_the_host(bridge) -> None:
    assert bridge.load("/m", {"": "cpu"}, dtype="float16", options={"x": 1}) == 7
    assert bridge.cancel() is True
    assert bridge.host.calls[:2] == [("load", "/m", {"": "cpu"}, "float16", {"x": 1}), ("cancel",)]


def test_shutdown_stops_delivery(qtbot, bridge) -> None:
    received: list[Any] = []
    bridge.event.connect(received.append)
    bridge.start()
    bridge.shutdown()
    bridge.host.play([Phase(1, "late")]).join()
    assert bridge.drain() == 0 and received == []
    assert ("shutdown",) in bridge.host.calls


@pytest.mark.slow
def test_real_worker_reports_a_bad_source_and_stays_usable(
    qtbot, tmp_path, stop_resource_tracker
) -> None:
    bridge = WorkerBridge(offload_root=tmp_path / "offload")
    try:
        with qtbot.waitSignal(bridge.failed, timeout=120_000) as blocker:
            bridge.load(tmp_path / "missing-model", {"": "cpu"})
        failed = blocker.args[0]
        assert failed.kind == "bad_input" and "missing-model" in failed.message
        qtbot.waitUntil(lambda: bridge.state == "idle", timeout=10_000)
    finally:
        bridge.shutdown()
    assert bridge.state == "stopped"


_RACE_SCRIPT = """
import sys, threading
import workbench.gui.bridge  # noqa: F401  (makes None/True/False immortal on < 3.12)
from PySide6.QtCore import QObject, Signal

class Emitter(QObject):
    ev = Signal(int)

emitter, done = Emitter(), []
emitter.ev.connect(lambda value: None)

def churn():
    items = []
    for i in range(1_500_000):
        items.append((i, True, None))
        if len(items) > 1000:
            items.clear()
    done.append(True)

thread = threading.Thread(target=churn)
thread.start()
while not done:
    emitter.ev.emit(1)
thread.join()
print("survived")
"""


def test_signal_emits_survive_a_busy_python_thread() -> None:
    """PySide6 6.12 on CPython 3.11 corrupts None/True refcounts in emit() while another thread
    runs; without the bridge's fix this script aborts with "Fatal Python error: bool_dealloc"."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _RACE_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "survived" in result.stdout, result.stderr[-2000:]


def test_worker_log_records_reach_the_hosts_workbench_loggers(bridge, qtbot, caplog) -> None:
    caplog.set_level(logging.INFO, logger="workbench")
    bridge.start()
    with qtbot.waitSignal(bridge.log, timeout=5000):
        bridge.host.play(
            [Log(logging.WARNING, "workbench.big_modeling.loading: missing keys: lm_head.bias")]
        ).join()
    records = [r for r in caplog.records if r.name == "workbench.worker"]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.WARNING, "workbench.big_modeling.loading: missing keys: lm_head.bias")
    ]


def test_infer_predicts_for_the_providers_profile_unless_told_otherwise(bridge) -> None:
    class Profile:
        def to_dict(self) -> dict:
            return {"name": "what-if"}

    calls: list[tuple] = []
    bridge.host.infer = lambda prompt, **kwargs: calls.append((prompt, kwargs)) or 3
    assert bridge.infer("hi", max_new_tokens=2) == 3  # no provider: the worker detects
    bridge.profile_provider = Profile
    bridge.infer("hi", max_new_tokens=2)
    bridge.infer("hi", profile="rtx4090-64gb")
    assert calls == [
        ("hi", {"max_new_tokens": 2}),
        ("hi", {"max_new_tokens": 2, "profile": {"name": "what-if"}}),
        ("hi", {"profile": "rtx4090-64gb"}),
    ]
