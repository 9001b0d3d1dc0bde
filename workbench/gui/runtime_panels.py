"""The runtime half of the main window: load & dispatch, live plots, inference tests.

``RuntimePanels`` makes the toolbar actions (Load & dispatch, Cancel, Unload), the Memory /
Transfers / Inference tabs and the load progress, and wires them to one ``WorkerBridge``; the
window places them (its toolbar, bottom tabs and status bar) while it builds itself. The
worker process is spawned in the background as soon as a model is open (``warm_on_open``), so
it has done its imports (torch, transformers, the engine) before the user clicks Load, and the
click pays only for the load; the status bar says "worker warming up" until it is ready. An
empty window starts no worker. What can fail at run time without being a bug (detecting the hardware, spawning the
worker, predicting a map the speed model refuses) is logged, and the log view shows it.

Example:
    >>> panels = RuntimePanels(window, window.session, window.hardware_profile)  # doctest: +SKIP
    >>> panels.load_action.trigger()
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QEvent, QObject, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QWidget

from workbench.gui.bridge import WorkerBridge
from workbench.gui.inference_panel import InferencePanel
from workbench.gui.load_panel import LoadController, LoadProgressWidget
from workbench.gui.plots import group_layer_timings, summarize_layers
from workbench.gui.plots.memory_plot import MemoryPlot
from workbench.gui.plots.transfer_plot import TransferPlot
from workbench.gui.window_persistence import model_display_name
from workbench.models.hardware import DETECTED_NAME, detect_hardware
from workbench.runtime import BadInputError, normalize_device
from workbench.runtime.machine_attention import predict_with_attention
from workbench.runtime.precision_session import quantized_tree
from workbench.runtime.protocol import TelemetrySample, TransferBatch
from workbench.runtime.session import Session

logger = logging.getLogger(__name__)

REFRESH_HZ = 10.0  # the plots look for new data this often, at rest too (redraws are cheap)
LOAD_TIP = "Load the checkpoint along the current map in the worker process"


class RuntimePanels(QObject):
    """The runtime widgets and actions of a window, wired together.

    Args:
        window: the parent of every widget; its Close shuts the worker down (install this
            object as the window's event filter).
        session: the document the loads and runs are for.
        profile: returns the toolbar's hardware profile (what every prediction is for).
        known_profile: returns the selector's profile of a name, or ``None``; the detected
            profile is taken from there before detecting this machine again.
        bridge: the worker bridge to use (default: a new one around a ``WorkerHost``).
        warm_on_open: start the worker in the background once a model is open (default:
            unless ``$WORKBENCH_WARM_WORKER`` is ``0``).

    Attributes:
        bridge, controller, progress_widget, memory_plot, transfer_plot, inference_panel,
        load_action, cancel_action, unload_action.
    """

    _session_event = Signal(object)

    def __init__(
        self,
        window: QWidget,
        session: Session,
        profile: Callable[[], Any],
        *,
        known_profile: Callable[[str], Any] | None = None,
        bridge: WorkerBridge | None = None,
        warm_on_open: bool | None = None,
    ) -> None:
        super().__init__(window)
        self.window = window
        self.session = session
        self._known_profile = known_profile
        self.bridge = bridge or WorkerBridge(window)
        self.progress_widget = LoadProgressWidget(window)
        self.controller = LoadController(self.bridge, session, self.progress_widget, window)
        self.memory_plot = MemoryPlot(window, refresh_hz=REFRESH_HZ)
        self.transfer_plot = TransferPlot(window, refresh_hz=REFRESH_HZ)
        self.inference_panel = InferencePanel(
            self.bridge, lambda: self.controller.loaded_map, window
        )
        self.load_action = QAction("Load && dispatch", window)
        self.load_action.setObjectName("loadDispatchAction")
        self.load_action.setToolTip(LOAD_TIP)
        self.cancel_action = QAction("Cancel", window)
        self.cancel_action.setToolTip("Cancel the running load or inference run")
        self.unload_action = QAction("Unload", window)
        self.unload_action.setToolTip("Drop the loaded model and free the worker's memory")
        # inference predictions use the toolbar's profile, like the Transfers plot and the
        # status line, so every "predicted" figure in the window is for the same hardware
        self.bridge.profile_provider = profile
        self.units: list[str] = []  # layer units of the loaded model, in display order
        self._context = session.context  # the model the inference results are for
        # WORKBENCH_WARM_WORKER=0 turns warming off (the GUI tests of other things do, so
        # every window they open does not spawn a process importing torch)
        if warm_on_open is None:
            warm_on_open = os.environ.get("WORKBENCH_WARM_WORKER", "1") != "0"
        self.warm_on_open = warm_on_open
        # the hardware the worker runs on, for every prediction shown beside a measured figure
        # (the Transfers plot); None: this machine as detected. The toolbar's profile may be a
        # what-if, which the plan-time figures use and name.
        self.runtime_profile: Any = None
        self._detected: Any = None
        self._closed = False
        self._wire()
        self._update_actions()

    # -- wiring --------------------------------------------------------------------------
    def _wire(self) -> None:
        self.load_action.triggered.connect(self.controller.load)
        self.cancel_action.triggered.connect(self._on_cancel_triggered)
        self.unload_action.triggered.connect(self._on_unload_triggered)
        controller, bridge = self.controller, self.bridge
        controller.busy_changed.connect(self._update_actions)
        controller.loaded_changed.connect(self._update_actions)
        controller.loaded_changed.connect(lambda _loaded: self._show_loaded_model())
        controller.load_started.connect(lambda _rid: self._mark("load start"))
        controller.load_finished.connect(self._on_controller_load_finished)
        controller.load_failed.connect(
            lambda ev: self._mark("load cancelled" if ev.kind == "cancelled" else "load failed")
        )
        bridge.telemetry.connect(self._on_bridge_telemetry)
        bridge.transfers.connect(self._on_bridge_transfers)
        bridge.result.connect(lambda _ev: self._update_actions())
        bridge.failed.connect(lambda _ev: self._update_actions())
        bridge.state_changed.connect(self._on_bridge_state_changed)
        bridge.ready.connect(self._on_bridge_ready)
        controller.load_started.connect(self._on_controller_load_started)
        self.inference_panel.run_button.clicked.connect(self._update_actions)
        self.inference_panel.verify_button.clicked.connect(self._update_actions)
        self.inference_panel.run_finished.connect(lambda _r: self._update_actions())
        self.inference_panel.history.model.rowsInserted.connect(self._on_history_rows_inserted)
        self._session_event.connect(self._on_session_changed)  # queued if from another thread
        self._unsubscribe = self.session.subscribe(self._session_event.emit)
        self._budgets_from_session()

    def _on_session_changed(self, change: Any) -> None:
        what = getattr(change, "what", "")
        if what in ("budgets", "restored", "profile"):
            self._budgets_from_session()
        elif what in ("device_map", "opened"):
            self._peaks_from_profile()
        if what in ("opened", "restored", "device_map", "dtype", "source"):
            self._update_actions()  # Load & dispatch needs a model and a map that can load
        if what in ("opened", "restored"):
            self.warm_worker()
        context = self.session.context
        if context is not self._context:  # another model: nothing shown may be the old one's
            self._context = context
            self.inference_panel.clear_results()
            self.memory_plot.reset()  # its history and markers were the other model's
            self.transfer_plot.clear_layers()  # so were its forwards
            self._show_loaded_model()

    def _show_loaded_model(self) -> None:
        """Tell the inference panel which model Run and Verify act on."""
        controller = self.controller
        loaded = controller.loaded_source if controller.loaded else None
        on_screen = self.session.source
        different = loaded is not None and str(loaded) != str(on_screen)
        self.inference_panel.show_loaded_model(loaded, different=different)
        self.transfer_plot.set_model_note(
            f"forwards of {model_display_name(str(loaded))} (loaded, not the model on screen)"
            if different
            else ""
        )

    def _budgets_from_session(self) -> None:
        self.memory_plot.set_budgets(dict(self.session.budgets))
        self._peaks_from_profile()

    def runtime_hardware(self) -> Any:
        """The profile of the hardware the worker runs on: ``runtime_profile``, else the
        detected profile (the selector's, or detected once now)."""
        if self.runtime_profile is not None:
            return self.runtime_profile
        if self._detected is None:
            known = self._known_profile(DETECTED_NAME) if self._known_profile else None
            try:
                self._detected = known or detect_hardware()
            except (OSError, RuntimeError) as exc:  # no disk to measure, a CUDA error
                logger.warning("hardware detection failed, no predictions: %s", exc)
                return None
        return self._detected

    def prediction_label(self) -> str:
        """How the Transfers plot names its prediction: for this machine, or a profile."""
        profile = self.runtime_hardware()
        name = getattr(profile, "name", "")
        return "predicted for this machine" if name == DETECTED_NAME else f"predicted for {name}"

    def _peaks_from_profile(self) -> None:
        """Peak GB/s per source tier of the hardware the worker runs on (measured rates stand
        beside them): disk reads always; host-to-device only when the map (the loaded one,
        else the session's) puts something on an accelerator."""
        profile = self.runtime_hardware()
        if profile is None:
            return
        peaks = {"disk": float(getattr(profile, "disk_read_gbps", 0.0) or 0.0)}
        device_map = self.controller.loaded_map or dict(self.session.device_map or {})
        if any(_is_accelerator(device) for device in device_map.values()):
            peaks["cpu"] = float(getattr(profile, "host_to_device_gbps", 0.0) or 0.0)
        if {k: v for k, v in peaks.items() if v > 0} != self.transfer_plot.peaks_gbps:
            self.transfer_plot.set_peak_bandwidth(peaks)

    def _update_actions(self, *_: object) -> None:
        busy = self.controller.busy
        running = self.inference_panel.busy
        has_model = self.session.tree is not None
        check = self.controller.check() if has_model else None
        loadable = check is not None and check.loadable
        self.load_action.setEnabled(loadable and not busy and not running)
        reason = check.reason if check is not None and not loadable else ""
        self.load_action.setToolTip(f"{LOAD_TIP}\n\nCannot load: {reason}" if reason else LOAD_TIP)
        self.load_action.setStatusTip(f"Cannot load: {reason}" if reason else LOAD_TIP)
        self.cancel_action.setEnabled(busy or running)
        self.unload_action.setEnabled(self.controller.loaded and not busy and not running)
        self.inference_panel.set_available(self.controller.loaded and not busy)

    def _on_bridge_state_changed(self, state: str) -> None:
        self._update_actions()
        if state == "stopped":  # a worker that died or was terminated: warm a new one
            self.warm_worker()

    def warm_worker(self) -> bool:
        """Start the worker in the background when a model is open and none runs; say so in
        the status bar until it is ready. Return True when one was started."""
        if (
            self._closed
            or not self.warm_on_open
            or not self.can_load_here()
            or self.bridge.state != "stopped"
        ):
            return False
        try:
            self.bridge.start()
        except (OSError, RuntimeError) as exc:  # spawning failed; the first load tries again
            logger.warning("could not start the worker in the background: %s", exc)
            return False
        if not self.controller.busy:
            self.progress_widget.show_message("worker warming up (importing torch)…")
        return True

    def can_load_here(self) -> bool:
        """True when the model on screen has weights to load (a plan-only config has none:
        warming a worker for it would cost a process importing torch for nothing)."""
        opened = self.session.opened
        return opened is not None and bool(getattr(opened, "has_weights", False))

    def _on_bridge_ready(self, event: Any) -> None:
        logger.info("worker %s ready in %.1f s", event.pid, event.warmup_s)
        if not self.controller.busy and not self.controller.loaded:
            self.progress_widget.show_message("worker ready")

    def _on_controller_load_started(self, _request_id: int) -> None:
        status_bar = getattr(self.window, "statusBar", None)
        if callable(status_bar):  # a hint shown before the click would cover the load's
            status_bar().clearMessage()
        if not self.bridge.warm:
            self.progress_widget.show_message(
                "worker still warming up: the load starts when its imports are done"
            )

    def _on_cancel_triggered(self) -> None:
        """Cancel whatever runs: the load, or else the inference run (like its Stop)."""
        if self.controller.busy:
            self.controller.cancel()
        elif self.inference_panel.busy:
            self.inference_panel.stop()

    def _mark(self, label: str) -> None:
        self.memory_plot.add_marker(time.time(), label)  # telemetry uses the worker's time.time

    def _on_unload_triggered(self) -> None:
        self.controller.unload()
        self._mark("unload")
        self._update_actions()

    def _on_controller_load_finished(self, summary: Any) -> None:
        self._mark("load end")
        self._show_loaded_model()
        self.transfer_plot.clear_layers()
        self._peaks_from_profile()
        self._prediction_for_loaded_map()
        self._update_actions()

    def _on_history_rows_inserted(self, _parent: Any, first: int, _last: int) -> None:
        record = self.inference_panel.history.model.records[first]
        self._mark(f"{record.kind} #{record.run_id}")

    def _prediction_for_loaded_map(self) -> None:
        """Set the layer units and the speed model's per-layer prediction for the loaded map,
        for the hardware it runs on (the bars beside it are measured there), at the precisions
        it was loaded with and without prefetch, as the run's own prediction
        (``runtime.inference``)."""
        tree, profile = self.session.tree, self.runtime_hardware()
        device_map = self.controller.loaded_map or {}
        precisions = self.controller.loaded_precisions
        if precisions and self.session.opened is not None:
            tree = quantized_tree(self.session.opened, precisions)
        self.units = [name for name in device_map if name]
        prediction = None
        if tree is not None and profile is not None and device_map:
            try:
                prediction = predict_with_attention(
                    self.session.opened,
                    tree,
                    device_map,
                    profile,
                    prefetch=False,
                    precisions=precisions,
                )
            except BadInputError as exc:  # a map the speed model refuses: no prediction bars
                logger.info("no per-layer prediction for the loaded map: %s", exc)
        if prediction is not None and prediction.per_layer:
            self.units = [p.name for p in prediction.per_layer]
        self.transfer_plot.set_layers(self.units)
        self.inference_panel.units = list(self.units)
        self.inference_panel.keep_module = self._in_model_tree
        if prediction is not None:
            self.transfer_plot.set_prediction(
                {p.name: (p.time_s or p.transfer_s + p.compute_s) for p in prediction.per_layer},
                label=self.prediction_label(),
            )

    def _in_model_tree(self, module: str) -> bool:
        tree = self.session.tree
        return tree is None or module in tree

    def _on_bridge_telemetry(self, sample: TelemetrySample) -> None:
        values: dict[str, float] = {
            "worker rss": sample.rss_bytes,
            "system available": sample.available_bytes,
        }
        for mem in sample.cuda:
            values[f"cuda:{mem.device} allocated"] = mem.allocated_bytes
            values[f"cuda:{mem.device} reserved"] = mem.reserved_bytes
            if mem.nvml_used_bytes is not None:
                values[f"cuda:{mem.device} nvml"] = mem.nvml_used_bytes
        if sample.file_backed_bytes is not None:  # after the others: existing CSV columns stay
            values["worker file-backed"] = sample.file_backed_bytes
        self.memory_plot.append_sample(sample.time_s, values)

    def _on_bridge_transfers(self, batch: TransferBatch) -> None:
        if batch.events:
            rows = group_layer_timings(
                summarize_layers(batch.events), self.units, keep=self._in_model_tree
            )
            self.transfer_plot.add_forward(rows)

    # -- lifetime ------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the worker and the plot timers; idempotent (called when the window closes)."""
        if self._closed:
            return
        self._closed = True
        self._unsubscribe()
        self.controller.close()
        self.memory_plot.timer.stop()
        self.transfer_plot.timer.stop()
        self.bridge.shutdown()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.window and event.type() == QEvent.Type.Close:
            self.shutdown()
        # a hovered action's status tip would replace the load's message in the status bar
        return (
            watched is self.window
            and event.type() == QEvent.Type.StatusTip
            and self.controller.busy
        )


def _is_accelerator(device: Any) -> bool:
    try:  # the one device parser: "1" and "cuda:1" are GPU 1, "\u00b2" is no device
        canonical = normalize_device(device)
    except BadInputError:
        return False
    return isinstance(canonical, int) or str(canonical).split(":", 1)[0] in _ACCELERATORS


_ACCELERATORS = ("cuda", "mps", "xpu", "npu")
