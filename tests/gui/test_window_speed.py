"""The window's predicted speed for the map on screen counts the model's attention (issue 21):
the same figure the speed model gives with the model's layout, which a bare tree lacks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from workbench.models.speed import predict_speed
from workbench.runtime.planning import attention_layout

pytestmark = pytest.mark.gui


def test_the_windows_prediction_counts_attention(
    main_window: Any, open_in_window: Any, whatif_config: Path
) -> None:
    opened = open_in_window(main_window, whatif_config)
    main_window.update_speed_prediction(wait=True)
    shown = main_window.speed_prediction
    assert shown is not None
    session = main_window.session
    profile = main_window.hardware.profile
    with_layout = predict_speed(
        opened.tree, dict(session.device_map), profile, attention=attention_layout(opened)
    )
    assert shown.tokens_per_s == pytest.approx(with_layout.tokens_per_s)
    layers = [layer for layer in shown.per_layer if ".layers." in f".{layer.name}"]
    assert layers and all(layer.attention_s > 0 for layer in layers)
    bare = predict_speed(opened.tree, dict(session.device_map), profile)
    assert all(layer.attention_s == 0 for layer in bare.per_layer)


def test_a_prediction_for_this_machine_says_when_its_host_costs_are_typical(
    main_window: Any,
    open_in_window: Any,
    whatif_config: Path,
    test_profile: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh install predicts this machine from typical host costs until its first run
    measures them: the label says so (it showed 73.9 tok/s for a model that ran at 24), and
    stops saying so once the machine's figures are in."""
    from dataclasses import replace

    from workbench.gui.window_hardware import UNMEASURED_HOST
    from workbench.models.dispatch_probe import DispatchOverhead
    from workbench.models.hardware import DETECTED_NAME
    from workbench.models.host_measurements import HostMeasurements
    from workbench.models.matmul_probe import MatmulCurve

    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))  # nothing measured here yet
    open_in_window(main_window, whatif_config)
    label = main_window.speed_label
    main_window.update_speed_prediction(wait=True)
    assert "Predicted for test-2x24g" in label.text()
    assert UNMEASURED_HOST not in label.text()  # a what-if profile: nothing to measure

    main_window.hardware.set_hardware_profile(replace(test_profile, name=DETECTED_NAME))
    main_window.update_speed_prediction(wait=True)
    assert "Predicted for this machine" in label.text()
    assert UNMEASURED_HOST in label.text()

    measured = HostMeasurements(
        DispatchOverhead(21e-6, 0.4e-3, 2, 0.0),
        MatmulCurve({"bfloat16": [[2**20, 2e-4], [2**22, 6e-4]]}, 2, 0.0),
        None,
    )
    main_window.hardware.take_host_measurements(measured)
    main_window.update_speed_prediction(wait=True)
    assert "Predicted for this machine" in label.text()
    assert UNMEASURED_HOST not in label.text()
