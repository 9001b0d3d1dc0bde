"""Tools > Convert for loading: turn the open GGUF file into the folder Load & dispatch loads.

A ``.gguf`` opens for planning from its header alone; loading needs its weights de-quantized
into a safetensors Hugging Face folder. ``GGUFConversion`` gives the user that step as an
action of its own (the load job still converts on its own when nobody did): it runs
``workbench.runtime.gguf_convert.iter_conversion`` on a ``TaskThread``, never on the GUI
thread, and shows each stage in ``ConvertProgressWidget`` in the status bar ("converting
tensors (120 of 272)", a bar, Cancel). Cancel sets the job's token: the conversion stops
between tensors and leaves no partial folder.

The folder goes into the workbench cache under the file's SHA-256
(``workbench.models.gguf_convert.converted_folder``), the place the load job looks, so a
converted file loads like any folder (after hashing it, not converting it again), and a file
converted before is found at once ("already converted"). The session keeps the ``.gguf`` as its
source: the tree keeps its Stored (GGUF) column and the map stays as it is.

Example:
    >>> conversion = GGUFConversion(window)  # doctest: +SKIP
    >>> conversion.action.trigger()  # converts window.session.source on a worker thread
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import shiboken6
from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QApplication, QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

from workbench.gui.window_context import WindowContext
from workbench.gui.workers import TaskThread
from workbench.runtime import LoadCancelled
from workbench.runtime.gguf_convert import (
    CONVERT_STAGES,
    CancelToken,
    ConversionDone,
    ConvertProgress,
    iter_conversion,
)

logger = logging.getLogger(__name__)

ACTION_TEXT = "Con&vert for loading"
CONVERT_TIP = (
    "Convert the open GGUF file once into a safetensors folder in the workbench cache "
    "(de-quantized to the Size column's dtype), so Load & dispatch loads it like any folder"
)
NEEDS_GGUF = "Open a .gguf file first (File > Open)"
CONVERTING = "A conversion is running (Cancel it in the status bar)"
THREAD_NAME = "convert gguf"
_CONVERTED_STAGE = CONVERT_STAGES[2]  # reached only when the file was not converted before


class ConvertProgressWidget(QWidget):
    """Status-bar piece of a conversion: what it does, a bar, Cancel. Hidden when idle."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("convertProgress")
        self.label = QLabel("", self)
        self.label.setObjectName("convertStatusLabel")
        self.bar = QProgressBar(self)
        self.bar.setObjectName("convertProgressBar")
        self.bar.setMaximumWidth(160)
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.setObjectName("convertCancelButton")
        self.cancel_button.setToolTip("Stop the conversion; nothing is left in the cache")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for widget in (self.label, self.bar, self.cancel_button):
            layout.addWidget(widget)
        self.setVisible(False)

    def show_started(self, name: str) -> None:
        """Show an indeterminate bar for the conversion of ``name``."""
        self.label.setText(f"Converting {name}…")
        self.bar.setRange(0, 0)
        self.cancel_button.setEnabled(True)
        self.setVisible(True)

    def show_report(self, name: str, report: ConvertProgress) -> None:
        """Show one ``ConvertProgress``: a count for tensors and shards, busy otherwise."""
        if report.total:
            self.bar.setRange(0, report.total)
            self.bar.setValue(report.done)
            self.bar.setFormat("%v of %m")
        else:
            self.bar.setRange(0, 0)
        self.label.setText(f"Converting {name}: {report.describe()}…")

    def show_cancelling(self) -> None:
        self.cancel_button.setEnabled(False)
        self.label.setText("Cancelling the conversion…")

    def finish(self) -> None:
        self.setVisible(False)
        self.bar.setRange(0, 0)
        self.bar.resetFormat()


@dataclass(frozen=True)
class ConversionResult:
    """What ``run_conversion`` returns: the folder, and whether this call converted it
    (``False``: the cache held it already)."""

    folder: Path
    converted_now: bool


def run_conversion(
    path: str,
    token: CancelToken,
    report: Callable[[ConvertProgress], object],
    *,
    cache_root: str | os.PathLike[str] | None = None,
) -> ConversionResult:
    """Drive ``iter_conversion`` to its end on the calling (worker) thread.

    Args:
        path: the ``.gguf`` file.
        token: cancels the conversion.
        report: called with each ``ConvertProgress`` (throttled to ~20 Hz).
        cache_root: where converted folders live (default: the workbench cache, where the load
            job looks).

    Returns:
        The folder, and whether this call converted it (``False``: it was in the cache).

    Raises:
        LoadCancelled: the token was set (nothing is left behind).
        ModelSourceError: the file cannot be converted.
    """
    converted = False
    for event in iter_conversion(path, token, cache_root=cache_root):
        if isinstance(event, ConversionDone):
            return ConversionResult(event.folder, converted)
        converted = converted or event.stage == _CONVERTED_STAGE
        report(event)
    raise RuntimeError(f"the conversion of {path} ended without its folder")  # pragma: no cover


class GGUFConversion(QObject):
    """The Convert for loading action, its job and its status-bar progress.

    Signals:
        reported(object): each ``ConvertProgress`` (emitted on the worker thread; slots of
            GUI objects run queued).
        finished(object): the ``ConversionResult`` of a conversion that succeeded.
        failed(object): the exception of one that failed or was cancelled (``LoadCancelled``).

    Args:
        window: the main window: its session's source is what converts; the progress widget
            goes into its status bar; failures go to its ``show_error``.
        cache_root: where converted folders live (default: the workbench cache; tests).

    Attributes:
        action: the ``QAction`` (Tools menu and toolbar), enabled while a GGUF is open and
            no conversion runs.
        progress_widget: the status-bar ``ConvertProgressWidget``.
        thread: the running or last conversion thread, or ``None``.
        folder: the folder of the last finished conversion, or ``None``.
    """

    finished = Signal(object)
    failed = Signal(object)
    reported = Signal(object)  # ConvertProgress, emitted on the worker thread (queued here)
    _session_changed = Signal()  # the session's callbacks, queued-safe

    def __init__(
        self, window: WindowContext, *, cache_root: str | os.PathLike[str] | None = None
    ) -> None:
        super().__init__(window)  # type: ignore[arg-type]  # the context is the window
        self._window = window
        self._cache_root = cache_root
        self.action = QAction(ACTION_TEXT, self)
        self.action.setObjectName("convertForLoadingAction")
        self.progress_widget = ConvertProgressWidget(window)  # type: ignore[arg-type]
        window.statusBar().addPermanentWidget(self.progress_widget)
        self.thread: TaskThread | None = None
        self.folder: Path | None = None
        self._token: CancelToken | None = None
        self._running = False  # from start until its result is handled (reports still show)
        self._name = ""
        self.action.triggered.connect(self.start)
        self.progress_widget.cancel_button.clicked.connect(self.cancel)
        self.reported.connect(self._on_job_reported)
        self._session_changed.connect(self.refresh)
        window.session.subscribe(self._on_session_changed)
        app = QApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self._stop_for_quit)
        self.refresh()

    @property
    def busy(self) -> bool:
        """Whether a conversion runs (until its result is shown)."""
        return self._running

    def source_gguf(self) -> str | None:
        """The session's source when it is a ``.gguf`` file, else ``None``."""
        source = self._window.session.source
        return source if source and source.lower().endswith(".gguf") else None

    def refresh(self) -> None:
        """Enable the action while a GGUF is open and idle; the tooltip says why not."""
        source, busy = self.source_gguf(), self.busy
        reason = CONVERTING if busy else "" if source else NEEDS_GGUF
        self.action.setEnabled(not reason)
        tip = f"{CONVERT_TIP} — {reason}" if reason else CONVERT_TIP
        self.action.setToolTip(tip)
        self.action.setStatusTip(tip)

    def start(self) -> TaskThread | None:
        """Convert the open GGUF on a worker thread; return the thread (``None``: nothing
        to convert, or a conversion already runs)."""
        source = self.source_gguf()
        if source is None or self.busy:
            self.refresh()
            return None
        self._name = Path(source).name
        self._running = True
        self._token = token = CancelToken()
        thread = TaskThread(
            run_conversion, source, token, self.reported.emit, cache_root=self._cache_root
        )
        thread.setObjectName(THREAD_NAME)
        thread.succeeded.connect(self._on_job_succeeded)
        thread.failed.connect(self._on_job_failed)
        self.thread = thread
        self.progress_widget.show_started(self._name)
        logger.info("converting %s for loading", source)
        thread.start()
        self.refresh()
        return thread

    def cancel(self) -> None:
        """Stop the running conversion (it ends at the next tensor, leaving nothing)."""
        if self._token is not None and self.busy:
            self._token.cancel()
            self.progress_widget.show_cancelling()

    def _on_session_changed(self, _change: Any) -> None:
        if shiboken6.isValid(self):  # the session may outlive the window
            self._session_changed.emit()

    def _stop_for_quit(self) -> None:
        if self._token is not None:
            self._token.cancel()
        if self.thread is not None:
            self.thread.wait()

    def _on_job_reported(self, report: ConvertProgress) -> None:
        if self._running:
            self.progress_widget.show_report(self._name, report)

    def _on_job_succeeded(self, result: ConversionResult) -> None:
        self.progress_widget.finish()
        self.folder = result.folder
        elapsed_s = self.thread.elapsed_s if self.thread is not None else 0.0
        if result.converted_now:
            text = f"Converted {self._name} in {elapsed_s:.1f} s; Load & dispatch loads it"
        else:
            text = f"{self._name} was converted before; Load & dispatch loads it"
        self._window.statusBar().showMessage(text, 8000)
        logger.info("%s: converted folder %s", self._name, result.folder)
        self._end()
        self.finished.emit(result)

    def _on_job_failed(self, exc: BaseException) -> None:
        self.progress_widget.finish()
        if isinstance(exc, LoadCancelled):
            self._window.statusBar().showMessage(
                f"Conversion of {self._name} cancelled; nothing was kept", 8000
            )
            logger.info("conversion of %s cancelled", self._name)
        else:
            self._window.statusBar().showMessage(f"Could not convert {self._name}", 8000)
            logger.error("could not convert %s: %s", self._name, exc)
            self._window.show_error("Could not convert the GGUF file", str(exc))
        self._end()
        self.failed.emit(exc)

    def _end(self) -> None:
        self._token, self._running = None, False
        if self.thread is not None:
            self.thread.wait()  # it emitted its result as its last act; let it end
        self.refresh()


__all__ = [
    "ConversionResult",
    "ConvertProgressWidget",
    "GGUFConversion",
    "run_conversion",
]
