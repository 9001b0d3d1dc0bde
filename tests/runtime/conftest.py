"""Runtime fixtures: an event log to wait on, a demo checkpoint, a guard against stray workers."""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from job_holds import HOLD_OBSERVER

from workbench.runtime.protocol import Event
from workbench.runtime.worker import WorkerHost

WAIT_S = 120.0  # generous: 8 engineers share 2 cores; waits end on events, not on time


class EventLog:
    """Collects a host's events; ``wait_for`` blocks until one matches (no sleeps)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._cond = threading.Condition()

    def __call__(self, event: Event) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[Event], bool], timeout_s: float = WAIT_S) -> Event:
        with self._cond:
            seen = 0
            while True:
                for event in self.events[seen:]:
                    if predicate(event):
                        return event
                seen = len(self.events)
                if not self._cond.wait(timeout_s):
                    kinds = [e.type_name for e in self.events if e.type_name != "TelemetrySample"]
                    raise AssertionError(f"no matching event within {timeout_s} s; saw {kinds}")

    def of(self, type_name: str) -> list[Event]:
        with self._cond:
            return [e for e in self.events if e.type_name == type_name]

    def final(self, request_id: int, timeout_s: float = WAIT_S) -> Event:
        """The ``Result`` or ``Failed`` of ``request_id``."""
        return self.wait_for(
            lambda e: (
                e.type_name in ("Result", "Failed") and getattr(e, "request_id", None) == request_id
            ),
            timeout_s,
        )


def zombie_children() -> list[psutil.Process]:
    """This process's children that exited but were never reaped (waited for)."""
    zombies = []
    for child in psutil.Process().children(recursive=False):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                zombies.append(child)
        except psutil.NoSuchProcess:
            continue
    return zombies


@pytest.fixture(autouse=True)
def no_stray_processes() -> Iterator[None]:
    """Fail any test that leaves a zombie or a worker (or any child) process running.

    Zombies are looked for first: ``multiprocessing.active_children()`` reaps finished
    children itself, so calling it first would hide them.
    """
    yield
    zombies = [z.pid for z in zombie_children()]
    children = multiprocessing.active_children()  # reaps what is left, for the next test
    for child in children:
        child.kill()
        child.join()
    assert not zombies, f"test left zombie processes (never reaped): {zombies}"
    assert not children, f"test left processes running: {children}"


@pytest.fixture
def events() -> EventLog:
    return EventLog()


@pytest.fixture
def host(events: EventLog, tmp_path: Path) -> Iterator[WorkerHost]:
    worker_host = WorkerHost(
        events, offload_root=tmp_path / "offload", cancel_grace_s=5.0, load_observer=HOLD_OBSERVER
    )
    try:
        yield worker_host
    finally:
        worker_host.shutdown()


# A small llama demo (2M params target, fp16, 2 shards) shared by the session; loads cast it to
# float32 (fast CPU matmuls; disk weights get written as .dat files, not pointed into shards).
@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from workbench.models import make_demo

    return make_demo(
        tmp_path_factory.mktemp("runtime") / "demo", arch="llama", params="2M", shards=2
    )


@pytest.fixture(scope="session")
def demo_config(demo_dir: Path) -> dict:
    return json.loads((demo_dir / "config.json").read_text())


@pytest.fixture
def cpu_disk_map(demo_config: dict) -> dict[str, str]:
    """Layer 0 on the CPU, every other layer on disk (at least two of them)."""
    layers = demo_config["num_hidden_layers"]
    assert layers >= 3, "the demo must have layers to offload"
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu"}
    device_map.update({f"model.layers.{i}": "disk" for i in range(1, layers)})
    device_map.update({"model.norm": "cpu", "lm_head": "cpu"})
    return device_map
