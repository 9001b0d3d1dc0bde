"""Tools > Measure this machine again: the host probes taken anew, with a busy dialog and Cancel.

The detected profile's speed figures rest on probes measured once per machine and cached
(``models.host_measurements``); one taken while the machine was busy stays until it is taken
again. The measurement runs as ``workbench measure`` in a child process
(``runtime.machine_measure``) on a worker thread; Cancel kills it. When it finishes the
detected profile takes the figures, the Predicted line is recomputed, and the figures go to
the Log and the status bar.

Example:
    >>> dialog = measure_machine_again(window)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QProgressDialog

from workbench.gui.workers import TaskThread
from workbench.runtime import LoadCancelled
from workbench.runtime.machine_measure import MachineMeasurement

__all__ = ["MeasureMachineDialog", "measure_machine_again"]

logger = logging.getLogger(__name__)


class MeasureMachineDialog(QProgressDialog):
    """A busy dialog over one ``MachineMeasurement``; Cancel stops it."""

    def __init__(self, window: Any) -> None:
        super().__init__(
            "Measuring this machine: the cost per module call, the CPU's matmul speed by "
            "weight size and its quantized kernels (10 to 40 s)…",
            "Cancel",
            0,
            0,
            window,
        )
        self.setWindowTitle("Measure this machine again")
        self.setWindowModality(Qt.WindowModality.WindowModal)
        self.setMinimumDuration(0)
        self.setAutoClose(False)
        self.setAutoReset(False)
        self.window_ = window
        self.measurement = MachineMeasurement()
        self.result: Any = None
        self.canceled.connect(self._on_canceled)
        self.thread = TaskThread(self.measurement.run)
        self.thread.succeeded.connect(self._on_succeeded)
        self.thread.failed.connect(self._on_failed)

    def start(self) -> None:
        self.show()
        self.thread.start()

    def _on_canceled(self) -> None:
        self.measurement.cancel()
        self.setLabelText("Stopping…")

    def _on_succeeded(self, measured: Any) -> None:
        self.result = measured
        self.window_.hardware.take_host_measurements(measured)
        for line in measured.lines():
            logger.info("this machine measured again: %s", line)
        self.window_.statusBar().showMessage(
            f"Measured this machine again ({measured.lines()[0]}); every figure is in the Log",
            15000,
        )
        self.close()

    def _on_failed(self, exc: BaseException) -> None:
        if isinstance(exc, LoadCancelled):
            self.window_.statusBar().showMessage(
                "Measuring this machine cancelled; the earlier figures stand", 8000
            )
        else:
            logger.warning("measuring this machine failed: %s", exc)
            self.window_.statusBar().showMessage(f"Measuring this machine failed: {exc}", 15000)
        self.close()


def measure_machine_again(window: Any) -> MeasureMachineDialog:
    """Start measuring this machine again over ``window``; the dialog shows until it ends."""
    dialog = MeasureMachineDialog(window)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.start()
    return dialog
