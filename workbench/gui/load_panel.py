"""Load & dispatch from the GUI: progress in the status bar, cancel, unload, errors, staleness.

``LoadController`` sends the session's device map to the worker through a ``WorkerBridge``,
follows the load's events, and shows failures in a non-modal dialog (the app keeps running and
the map is never touched). While a model is loaded it compares the session's map with the one
that was loaded and, when they differ, marks the model "changed since load" and offers Reload;
with another model on screen there is nothing to reload and the status says so.

``LoadProgressWidget`` is the status-bar piece: phase, bytes done/total, current tensor, ETA,
a progress bar, Cancel, and the Reload offer.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QWidget,
)

from workbench.gui.bridge import WorkerBridge
from workbench.gui.colors import WARNING_HEX
from workbench.gui.window_persistence import model_display_name
from workbench.runtime import OffloadError
from workbench.runtime.formatting import format_nbytes
from workbench.runtime.load_check import LoadCheck, check_devices, check_load, check_map
from workbench.runtime.model_context import LoadedModelRef
from workbench.runtime.protocol import Failed, LoadSummary, Phase, Progress, Result, WorkerExited
from workbench.wording import plural

logger = logging.getLogger(__name__)

ErrorPresenter = Callable[[str, str, str], None]  # (title, message, details)
_BAR_STEPS = 1000
# the phases whose Progress counts bytes: read, or (quantizing) weights quantized so far
_BYTE_PHASES = ("loading", "offloading", "quantizing")
FULL_BAR_MS = 1500  # a finished load leaves the bar at 100% this long, so the user sees it


def format_eta(seconds: float | None) -> str:
    """Return ``"ETA 12 s"``, ``"ETA 2 min 05 s"``, or ``""`` when unknown."""
    if seconds is None or math.isnan(seconds) or seconds < 0:
        return ""
    if seconds < 60:
        return f"ETA {seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"ETA {minutes} min {rest:02d} s"


class LoadProgressWidget(QWidget):
    """Status-bar widget: a label, a progress bar, Cancel, and "changed since load" + Reload."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = QLabel("", self)
        self.label.setObjectName("loadStatusLabel")
        self.label.setMinimumWidth(260)
        self.bar = QProgressBar(self)
        self.bar.setRange(0, _BAR_STEPS)
        self.bar.setMaximumWidth(180)
        self.bar.setTextVisible(True)
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.setToolTip("Stop the load; the device map stays as it is")
        self.stale_label = QLabel("map changed since load", self)
        self.stale_label.setObjectName("staleLabel")
        self.stale_label.setStyleSheet(f"color: {WARNING_HEX}; font-weight: bold;")
        self.reload_button = QPushButton("Reload", self)
        self.reload_button.setToolTip("Load again with the current device map")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for widget in (
            self.label,
            self.bar,
            self.cancel_button,
            self.stale_label,
            self.reload_button,
        ):
            layout.addWidget(widget)
        self._last_progress: Progress | None = None
        self.hide_bar_timer = QTimer(self)
        self.hide_bar_timer.setSingleShot(True)
        self.hide_bar_timer.setInterval(FULL_BAR_MS)
        self.hide_bar_timer.timeout.connect(lambda: self.bar.setVisible(False))
        self.set_busy(False)
        self.set_stale(False)

    def set_busy(self, busy: bool) -> None:
        self.hide_bar_timer.stop()
        self.bar.setVisible(busy)
        self.cancel_button.setVisible(busy)
        self.cancel_button.setEnabled(busy)

    def show_done(self) -> None:
        """Show the bar full for ``FULL_BAR_MS``, then hide it (a load finished)."""
        self.set_busy(False)
        self.bar.setRange(0, _BAR_STEPS)
        self.bar.setValue(_BAR_STEPS)
        self.bar.setFormat("100%")
        self.bar.setVisible(True)
        self.hide_bar_timer.start()

    def set_stale(self, stale: bool) -> None:
        self.stale_label.setVisible(stale)
        self.reload_button.setVisible(stale)

    def show_progress(self, event: Progress, phase: str | None = None) -> None:
        """Show the bytes of ``event``; the bar follows them while tensors are read, and is a
        busy indicator in the phases that read none (building, dispatching, paging in), rather than
        standing at 0% or 100% while the worker is busy."""
        self._last_progress = event
        fraction = event.fraction
        if (phase or event.phase) in _BYTE_PHASES and event.bytes_total > 0:
            self.bar.setRange(0, _BAR_STEPS)
            self.bar.setValue(round(fraction * _BAR_STEPS))
            self.bar.setFormat(f"{fraction:.0%}")
        else:
            self.bar.setRange(0, 0)  # busy: this phase has no bytes to count
        parts = [
            phase or event.phase,
            f"{format_nbytes(event.bytes_done)} / {format_nbytes(event.bytes_total)}",
        ]
        eta = format_eta(event.eta_s)
        if eta:
            parts.append(eta)
        self.label.setText(" · ".join(parts))
        self.label.setToolTip(event.tensor)
        if event.tensor:
            self.label.setText(f"{self.label.text()} · {_short(event.tensor)}")

    def show_phase(self, phase: str) -> None:
        """Show a new phase, keeping the bytes and tensor of the last progress report."""
        if self._last_progress is not None:
            self.show_progress(self._last_progress, phase)
        else:
            self.label.setText(f"{phase}…")
            if phase not in _BYTE_PHASES:
                self.bar.setRange(0, 0)  # busy until the first bytes are read

    def show_message(self, text: str) -> None:
        self.label.setText(text)
        self.label.setToolTip("")

    def reset(self) -> None:
        """Forget the last progress report (a new load starts)."""
        self._last_progress = None
        self.bar.setRange(0, _BAR_STEPS)
        self.bar.setValue(0)
        self.bar.setFormat("0%")


def _short(name: str, limit: int = 40) -> str:
    return name if len(name) <= limit else "…" + name[-(limit - 1) :]


class LoadController(QObject):
    """Runs loads of the session's map in the worker and tracks what is loaded.

    Args:
        bridge: the worker bridge.
        session: the ``workbench.runtime.session.Session`` whose map and source are loaded.
        progress_widget: where progress shows (a new one by default).
        parent: Qt parent; dialogs are parented to it when it is a widget.

    Attributes:
        error_presenter: ``(title, message, details) -> None``; the default opens a non-modal
            ``QMessageBox`` (kept in ``last_error_dialog``). Tests may replace it.
        errors: every ``(title, message, details)`` shown, oldest first.
        load_options: extra ``Load.options`` sent with every load (a load observer reads them).
        loaded_map: the map of the loaded model, or ``None``.
    """

    busy_changed = Signal(bool)
    loaded_changed = Signal(bool)
    stale_changed = Signal(bool)
    load_started = Signal(int)
    load_finished = Signal(object)  # LoadSummary
    load_failed = Signal(object)  # Failed
    _session_event = Signal(object)

    def __init__(
        self,
        bridge: WorkerBridge,
        session: Any,
        progress_widget: LoadProgressWidget | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.session = session
        self.progress_widget = progress_widget or LoadProgressWidget()
        self.error_presenter: ErrorPresenter = self._show_error_dialog
        self.last_error_dialog: QMessageBox | None = None
        self.errors: list[tuple[str, str, str]] = []
        self.load_options: dict[str, Any] = {}
        self.loaded_map: dict[str, int | str] | None = None
        self.loaded_source: str | None = None
        self.last_summary: LoadSummary | None = None
        self.request_id: int | None = None
        # loads are numbered 1, 2, 3 in the log: request ids also count runs and cancels
        self.load_number = 0
        self.stale = False
        # "Keep loaded" was the answer for the loaded model: not asked again until it changes
        self.keep_answered = False
        self._pending_map: dict[str, int | str] | None = None
        self._pending_precisions: dict[str, str] = {}
        self.loaded_precisions: dict[str, str] = {}  # the precision map the loaded model has
        self._pending_source: str | None = None
        self._pending_context: Any = None  # the ModelContext the running load is for
        self._loaded_context: Any = None  # the ModelContext of the model the worker holds
        self._cancel_clicked_s: float | None = None
        self._started_s: float | None = None
        self.progress_widget.cancel_button.clicked.connect(self.cancel)
        self.progress_widget.reload_button.clicked.connect(self.load)
        bridge.progress.connect(self._on_bridge_progress)
        bridge.phase.connect(self._on_bridge_phase)
        bridge.result.connect(self._on_bridge_result)
        bridge.failed.connect(self._on_bridge_failed)
        bridge.exited.connect(self._on_bridge_exited)
        self._session_event.connect(self._on_session_changed)
        self._unsubscribe = session.subscribe(self._session_event.emit)
        self.progress_widget.show_message("worker idle")

    # -- state ---------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """True while a load runs."""
        return self.request_id is not None

    @property
    def loaded(self) -> bool:
        return self.loaded_map is not None

    # -- actions -------------------------------------------------------------------------
    def check(self) -> LoadCheck:
        """The shared load check of the session's map (what Load & dispatch would refuse)."""
        if not self.session.source:
            return LoadCheck(map_problems=("open a model first (File > Open)",))
        if self.session.opened is None:  # a source without the opened model: the map only
            device_map = self.session.device_map
            return LoadCheck(check_map(None, device_map), check_devices(device_map))
        return check_load(self.session.opened, self.session.device_map)

    def load(self) -> int | None:
        """Load the session's source along its current map; return the request id or None.

        The shared load check runs first: a map the loader would refuse never starts the
        worker, and the error says why."""
        if self.busy:
            return None
        source, device_map = self.session.source, dict(self.session.device_map)
        check = self.check()
        if not check.loadable:
            self._report_error("Cannot load", check.reason, "")
            return None
        options = dict(self.load_options)
        precision_map = getattr(self.session, "precision_map", None)
        if precision_map:  # the worker quantizes these modules between load and dispatch
            options.setdefault("precision_map", dict(precision_map))
        try:
            request_id = self.bridge.load(
                source, device_map, dtype=self.session.dtype, options=options
            )
        except OffloadError as exc:  # the load cannot run at all: a failed load, not a glitch
            self._fail_before_start(exc)
            return None
        except Exception as exc:  # a state error or a worker that cannot start
            logger.warning("load could not start: %s", exc)
            self._report_error("Cannot load", str(exc), _details(exc))
            return None
        self._pending_map = device_map
        self._pending_precisions = dict(options.get("precision_map") or {})
        self._pending_source = str(source)
        self._pending_context = getattr(self.session, "context", None)
        self.request_id = request_id
        self.load_number += 1
        self._started_s = time.monotonic()
        devices = sorted({str(device) for device in device_map.values()})
        logger.info(
            "load #%d started: %s along a map of %s on %s",
            self.load_number,
            source,
            plural(len(device_map), "entry"),
            ", ".join(devices),
        )
        self.progress_widget.reset()
        self.progress_widget.show_message(f"starting load of {_short(str(source))}")
        self.progress_widget.set_busy(True)
        self._set_stale(False)
        self.busy_changed.emit(True)
        self.load_started.emit(request_id)
        return request_id

    def cancel(self) -> bool:
        """Cancel the running load; the window is idle again when the worker confirms."""
        if not self.busy:
            return False
        self._cancel_clicked_s = time.monotonic()
        logger.info("load #%d: cancel requested", self.load_number)
        self.progress_widget.cancel_button.setEnabled(False)
        self.progress_widget.show_message("cancelling…")
        return self.bridge.cancel()

    def unload(self) -> None:
        """Drop the loaded model; the worker restarts empty and its memory drops."""
        if self.busy:
            return
        try:
            self.bridge.unload()
        except Exception as exc:
            self._report_error("Cannot unload", str(exc), _details(exc))
            return
        self._forget_loaded_model()
        logger.info("unload requested: the worker restarts empty")
        self.progress_widget.show_message("unloading…")

    def close(self) -> None:
        """Stop observing the session (the bridge is shut down by its owner)."""
        self._unsubscribe()

    # -- events --------------------------------------------------------------------------
    def _on_bridge_progress(self, event: Progress) -> None:
        if event.request_id == self.request_id:
            self.progress_widget.show_progress(event)

    def _on_bridge_phase(self, event: Phase) -> None:
        if event.request_id == self.request_id and self._cancel_clicked_s is None:
            self.progress_widget.show_phase(event.phase)

    def _on_bridge_result(self, event: Result) -> None:
        if event.request_id != self.request_id or event.job != "load":
            return
        summary = event.value
        logger.info("load #%d finished: %s", self.load_number, _describe_summary(summary))
        self._finish()
        self.last_summary = summary if isinstance(summary, LoadSummary) else None
        self.loaded_source = self._pending_source  # the model the load started for
        context = self._pending_context
        if context is not None and self._pending_map is not None:
            context.loaded = LoadedModelRef(str(self.loaded_source), self._pending_map, summary)
        self._loaded_context = context
        self.loaded_precisions = dict(self._pending_precisions)
        self._set_loaded(self._pending_map)
        self.progress_widget.show_done()
        load_s = getattr(summary, "load_s", 0.0)
        self.progress_widget.show_message(f"loaded in {load_s:.1f} s")
        self._on_session_changed(None)
        self.load_finished.emit(summary)

    def _on_bridge_failed(self, event: Failed) -> None:
        if event.request_id is None and event.job == "unload":
            self._report_error("Unload failed", event.message, event.details)
            return
        if event.request_id != self.request_id:
            return
        elapsed = self._elapsed_s()
        self._finish()
        # A load that does not finish leaves the worker empty (it is replaced, or the model it
        # held was dropped before the new one was read), whatever was loaded before.
        self._forget_loaded_model()
        if event.kind == "cancelled":
            logger.info("load #%d cancelled after %.1f s", self.load_number, elapsed)
            self.progress_widget.show_message("load cancelled")
        else:
            self.progress_widget.show_message("load failed")
            title = {
                "bad_input": "The model could not be loaded",
                "worker_died": "The worker process died during the load",
            }.get(event.kind, "Load failed")
            self._report_error(title, _with_hint(event), event.details)
        self.load_failed.emit(event)

    def _on_bridge_exited(self, event: WorkerExited) -> None:
        if event.expected:
            if not self.busy:
                self.progress_widget.show_message("worker idle")
            return
        was_loaded = self.loaded
        self._forget_loaded_model()
        if was_loaded and not self.busy:  # a load in flight reports through Failed
            self._report_error(
                "The worker process died",
                f"{event.message}. The model is no longer loaded; your device map is unchanged. "
                "Load it again when ready.",
                "",
            )
            self.progress_widget.show_message("worker died")

    def is_loaded_source(self, source: Any) -> bool:
        """True when ``source`` is the model loaded in the worker (not one loading)."""
        return self.loaded and source is not None and str(source) == self.loaded_source

    def _on_session_changed(self, change: Any) -> None:
        what = getattr(change, "what", "device_map")
        if what not in ("device_map", "source", "opened", "dtype", "restored"):
            return
        same_model = self.is_loaded_source(self.session.source)
        context = getattr(self.session, "context", None)
        if same_model and context is not None and context.loaded is None and self.loaded_map:
            # the loaded model reopened: its new context is the loaded one again
            context.loaded = LoadedModelRef(
                str(self.loaded_source), dict(self.loaded_map), self.last_summary
            )
            self._loaded_context = context
        # only the model on screen can be "changed since load"; another one offers no Reload
        self._set_stale(same_model and dict(self.session.device_map) != self.loaded_map)
        if self.loaded and not self.busy and not same_model and what in ("opened", "source"):
            name = _short(model_display_name(str(self.loaded_source)))
            self.progress_widget.show_message(f"{name} loaded · not the model on screen")
        elif same_model and not self.busy and what in ("opened", "source"):
            name = _short(model_display_name(str(self.loaded_source)))
            self.progress_widget.show_message(f"{name} loaded")

    # -- helpers -------------------------------------------------------------------------
    def _fail_before_start(self, exc: OffloadError) -> None:
        """Report a load that could not start (no offload folder) like one the worker failed."""
        self.progress_widget.reset()
        self.progress_widget.show_message("load failed")
        failure = Failed(None, str(exc), details=_details(exc), kind="bad_input", job="load")
        self._report_error(
            "The offload folder cannot be created",
            f"{exc}\n\nThe device map is unchanged.",
            failure.details,
        )
        self.load_failed.emit(failure)

    def _elapsed_s(self) -> float:
        return 0.0 if self._started_s is None else time.monotonic() - self._started_s

    def _finish(self) -> None:
        self.request_id = None
        self._started_s = None
        self._cancel_clicked_s = None
        self.progress_widget.set_busy(False)
        self.busy_changed.emit(False)

    def _forget_loaded_model(self) -> None:
        """The worker holds no model: nothing may say one is loaded."""
        if self._loaded_context is not None:
            self._loaded_context.loaded = None
            self._loaded_context = None
        self._set_loaded(None)

    def _set_loaded(self, device_map: Mapping[str, int | str] | None) -> None:
        before = self.loaded
        self.keep_answered = False  # another load, or none: ask again
        self.loaded_map = None if device_map is None else dict(device_map)
        if device_map is None:
            self.loaded_precisions = {}
            self._set_stale(False)
        if self.loaded != before:
            self.loaded_changed.emit(self.loaded)

    def _set_stale(self, stale: bool) -> None:
        if stale == self.stale:
            return
        self.stale = stale
        self.progress_widget.set_stale(stale)
        self.stale_changed.emit(stale)

    def _report_error(self, title: str, message: str, details: str) -> None:
        logger.warning("%s: %s", title, message.replace("\n\n", " "))
        self.errors.append((title, message, details))
        self.error_presenter(title, message, details)

    def _show_error_dialog(self, title: str, message: str, details: str) -> None:
        parent = self.parent() if isinstance(self.parent(), QWidget) else None
        box = QMessageBox(
            QMessageBox.Icon.Warning, title, message, QMessageBox.StandardButton.Ok, parent
        )
        box.setObjectName("workerErrorDialog")
        if details:
            box.setDetailedText(details)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.setModal(False)
        box.destroyed.connect(self._on_error_dialog_destroyed)
        box.show()
        self.last_error_dialog = box

    def _on_error_dialog_destroyed(self) -> None:
        self.last_error_dialog = None


def _with_hint(event: Failed) -> str:
    hints = {
        "bad_input": "Fix the file or the map, then load again. The device map is unchanged.",
        "worker_died": "It may have run out of memory or been killed. The device map is "
        "unchanged; load again, perhaps with more modules on disk.",
    }
    hint = hints.get(event.kind, "The device map is unchanged; you can load again.")
    return f"{event.message}\n\n{hint}"


def _describe_summary(summary: object) -> str:
    if not isinstance(summary, LoadSummary):
        return "no summary"
    placed = ", ".join(
        f"{device} {format_nbytes(nbytes)}" for device, nbytes in summary.nbytes_by_device.items()
    )
    return (
        f"{summary.model_class} in {summary.load_s:.1f} s, {format_nbytes(summary.bytes_total)} "
        f"({summary.bytes_total:,} bytes)" + (f" on {placed}" if placed else "")
    )


def _details(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
