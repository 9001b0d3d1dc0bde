"""GUI fixtures: offscreen Qt, isolated settings, a generated demo, a what-if profile, a window.

Shared by every GUI test (part 1 and part 2). Settings and the autosave go to a temporary
folder, so tests never touch the user's real settings. An autouse guard fails a test that
leaves a task thread or a child process running.
"""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before anything imports Qt

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

GIB = 1024**3


@pytest.fixture(scope="session", autouse=True)
def _isolated_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """QSettings (ini) and AppDataLocation in a temporary folder for the whole session."""
    from PySide6.QtCore import QSettings

    root = tmp_path_factory.mktemp("qt-settings")
    saved = {
        key: os.environ.get(key)
        for key in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "WORKBENCH_WARM_WORKER")
    }
    os.environ["XDG_DATA_HOME"] = str(root / "data")
    os.environ["XDG_CONFIG_HOME"] = str(root / "config")
    # no background worker for windows the tests open through the app's own entry points
    # (tests/gui/test_worker_warmup.py turns it on for its window)
    os.environ["WORKBENCH_WARM_WORKER"] = "0"
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    for fmt in (QSettings.Format.IniFormat, QSettings.Format.NativeFormat):
        QSettings.setPath(fmt, QSettings.Scope.UserScope, str(root / "settings"))
    yield root
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def clean_settings(_isolated_settings: Path) -> Path:
    """Start a test with empty settings and no autosave file."""
    from workbench.gui import settings as app_settings

    settings = app_settings.app_settings()
    settings.clear()
    settings.sync()
    app_settings.autosave_path().unlink(missing_ok=True)
    return _isolated_settings


def _is_resource_tracker(process: psutil.Process) -> bool:
    return any("resource_tracker" in part for part in process.cmdline())


@pytest.fixture(autouse=True)
def _no_leftover_threads_or_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a task thread or a child process running (then clean up)."""
    yield
    if "qapp" not in request.fixturenames and "qtbot" not in request.fixturenames:
        return
    from workbench.gui.workers import running_threads, wait_for_threads

    threads = [t.objectName() or repr(t) for t in running_threads()]
    wait_for_threads(10_000)
    children = [p for p in psutil.Process().children(recursive=True) if p.is_running()]
    alive = []
    for child in children:
        try:
            # multiprocessing's resource tracker outlives the workers by design
            if child.status() != psutil.STATUS_ZOMBIE and not _is_resource_tracker(child):
                alive.append(f"{child.pid} {' '.join(child.cmdline()[:3])}")
        except psutil.Error:
            continue
    problems = []
    if threads:
        problems.append(f"task threads still running: {', '.join(sorted(threads))}")
    if alive:
        problems.append(f"child processes still running: {', '.join(alive)}")
    if problems:
        pytest.fail("; ".join(problems) + ". Wait for them or shut them down in the test.")


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated tiny llama demo (config, 2 safetensors shards + index, tokenizer), seeded."""
    from workbench.models import make_demo

    folder = tmp_path_factory.mktemp("demo") / "demo-llama"
    return Path(make_demo(folder, arch="llama", params="2M", shards=2, dtype="float16", seed=0))


@pytest.fixture(scope="session")
def whatif_config() -> Path:
    """The bundled tiny demo config (shapes only, no weights): a fast what-if model."""
    from workbench.resources import resource_path

    return resource_path("configs", "tiny-llama-demo.json")


@pytest.fixture(scope="session")
def test_profile() -> Any:
    """A what-if profile independent of this machine: 2 x 24 GiB GPUs, 64 GiB RAM, disk."""
    from workbench.models.hardware import DeviceSpec, HardwareProfile

    return HardwareProfile(
        name="test-2x24g",
        description="two 24 GiB GPUs, 64 GiB RAM, NVMe (tests)",
        devices=(
            DeviceSpec(0, "GPU 0", 24 * GIB, None, 80.0, 900.0),
            DeviceSpec(1, "GPU 1", 24 * GIB, None, 80.0, 900.0),
            DeviceSpec("cpu", "RAM", 64 * GIB, None, 1.0, 50.0),
            DeviceSpec("disk", "NVMe", 1024 * GIB, None, 0.0, 0.0),
        ),
        host_to_device_gbps=25.0,
        disk_read_gbps=3.0,
    )


@pytest.fixture
def worker_bridge() -> Any:
    """The worker bridge ``main_window`` gets; None: the window makes its own. A test module
    overrides this fixture to give the window a configured bridge."""
    return None


@pytest.fixture
def main_window(
    qtbot: Any, clean_settings: Path, test_profile: Any, worker_bridge: Any
) -> Iterator[Any]:
    """A shown ``MainWindow`` planning for ``test_profile``; closed (threads joined) after."""
    from workbench.gui.main_window import MainWindow

    errors: list[tuple[str, str]] = []
    # no background worker per opened model: the tests that want one turn it back on
    window = MainWindow(
        profiles=[test_profile],
        warm_worker=False,
        show_error=lambda title, text: errors.append((title, text)),
        bridge=worker_bridge,
    )
    # a test's edits are no one's work: close without asking (qtbot closes before teardown)
    qtbot.addWidget(window, before_close_func=lambda w: w.session.mark_clean())
    window.errors = errors  # type: ignore[attr-defined]  # what show_error was given
    window.show()
    yield window
    window.session.mark_clean()
    window.close()


@pytest.fixture
def open_in_window(qtbot: Any) -> Any:
    """Return ``open(window, source)``: opens on the worker thread and waits until shown."""

    def open_source(window: Any, source: str | Path, timeout_ms: int = 60_000) -> Any:
        before = window.session.opened
        thread = window.open_source(str(source))
        assert thread is not None, "the window refused to open (already opening?)"
        qtbot.waitUntil(
            lambda: window.session.opened is not before or bool(window.errors), timeout=timeout_ms
        )
        qtbot.waitUntil(lambda: not thread.isRunning(), timeout=5000)
        assert not window.errors, window.errors
        return window.session.opened

    return open_source


class _TinyOpened:
    """The parts of ``OpenedModel`` the window uses, over a hand-made module (see below)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    @property
    def has_weights(self) -> bool:
        return self.checkpoint is not None

    def module_sizes(self, dtype: Any = None) -> dict[str, int]:
        """The tree's bytes per name (as ``OpenedModel``)."""
        return (self if dtype is None else self.with_dtype(dtype)).tree.module_sizes()

    def with_dtype(self, dtype: Any) -> _TinyOpened:
        """A copy whose tree counts floating weights in ``dtype`` (as ``OpenedModel``)."""
        from workbench.big_modeling.dtypes import parse_dtype
        from workbench.models.tree import build_module_tree

        planning = parse_dtype(dtype)
        tree = build_module_tree(self.model, dtype=planning, no_split_classes=self.no_split_modules)
        return _TinyOpened(**{**self.__dict__, "tree": tree, "planning_dtype": planning})


@pytest.fixture(scope="session")
def tiny_opened() -> Any:
    """A real module tree (meta weights) with a no-split block class and a tied pair.

    Sizes (float32): embed 16x8 = 512 B (tied with head), each Block = 2 x (8x8 + 8) x 4 B = 576 B,
    4 blocks = 2304 B, norm 8 x 4 = 32 B; total 512 + 2304 + 32 = 2848 B (head shares embed's).
    """
    import torch
    from torch import nn

    from workbench.models.tree import build_module_tree

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.Linear(8, 8)
            self.mlp = nn.Linear(8, 8)

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(16, 8)
            self.layers = nn.ModuleList(Block() for _ in range(4))
            self.norm = nn.LayerNorm(8, bias=False)
            self.head = nn.Linear(8, 16, bias=False)
            self.head.weight = self.embed.weight

    with torch.device("meta"):
        model = TinyLM()
    tree = build_module_tree(model, no_split_classes=["Block"])
    return _TinyOpened(
        source="tiny-lm",
        tree=tree,
        model=model,
        config=None,
        checkpoint=None,
        no_split_modules=["Block"],
        tied_groups=tree.tied_groups,
        planning_dtype=None,
        model_class="TinyLM",
        folder=None,
    )


@pytest.fixture
def tiny_window(main_window: Any, tiny_opened: Any) -> Any:
    """``main_window`` showing ``tiny_opened`` with everything on cpu."""
    main_window.set_opened("tiny-lm", tiny_opened, {"": "cpu"})
    return main_window


@pytest.fixture
def stop_resource_tracker() -> Iterator[None]:
    """Stop multiprocessing's resource tracker after the test.

    Spawning the worker starts that helper process, which otherwise lives as long as pytest and
    trips the leftover-process guard; the next spawn starts it again. Ask for it first, so it is
    torn down last (after the window closed and its worker exited).
    """
    yield
    from multiprocessing import resource_tracker

    resource_tracker._resource_tracker._stop()
