"""Tools > Measure this machine again, in a real window: the child process measures, the
detected profile takes the figures, Cancel leaves the earlier ones (real probes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtWidgets import QPushButton

from workbench.gui.measure_machine import MeasureMachineDialog
from workbench.models.hardware import DETECTED_NAME, detect_hardware

pytestmark = pytest.mark.gui


@pytest.fixture
def detected_window(
    qtbot: Any, clean_settings: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    from workbench.gui.main_window import MainWindow

    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path / "cache"))  # never measured
    window = MainWindow(profiles=[detect_hardware()], warm_worker=False, show_error=print)
    qtbot.addWidget(window, before_close_func=lambda w: w.session.mark_clean())
    window.show()
    yield window
    window.session.mark_clean()
    window.close()


def _dialog(window: Any) -> MeasureMachineDialog:
    window.actions_by_name["measure_machine"].trigger()
    (dialog,) = window.findChildren(MeasureMachineDialog)
    return dialog


@pytest.mark.slow
def test_measuring_again_gives_the_detected_profile_the_figures(qtbot, detected_window) -> None:
    window = detected_window
    before = window.hardware.profile
    assert before.name == DETECTED_NAME and not before.dispatch_measured
    dialog = _dialog(window)
    assert dialog.isVisible() and "Measuring this machine" in dialog.labelText()
    qtbot.waitUntil(lambda: window.hardware.profile is not before, timeout=180_000)
    profile = window.hardware.profile
    measured = dialog.result
    assert profile.cpu_matmul_curve == measured.matmul_curve is not None
    listed = window.hardware.hardware_selector.profile(DETECTED_NAME)
    assert listed is not None and listed.cpu_matmul_curve == measured.matmul_curve
    # the dispatch probe may refuse a measurement drowned by the suite's other processes
    if measured.dispatch is not None:
        assert profile.dispatch_measured and listed.dispatch_measured
        assert profile.module_call_us == pytest.approx(measured.dispatch.per_module_s * 1e6)
    message = window.statusBar().currentMessage()
    assert message.startswith("Measured this machine again (dispatch: ") and "Log" in message


def test_cancel_keeps_the_earlier_figures(qtbot, detected_window) -> None:
    window = detected_window
    before = window.hardware.profile
    dialog = _dialog(window)
    assert dialog.measurement.started.wait(60)
    (cancel,) = dialog.findChildren(QPushButton)
    assert cancel.text() == "Cancel"
    cancel.click()
    qtbot.waitUntil(lambda: "cancelled" in window.statusBar().currentMessage(), timeout=60_000)
    assert window.hardware.profile is before
    assert window.statusBar().currentMessage() == (
        "Measuring this machine cancelled; the earlier figures stand"
    )
