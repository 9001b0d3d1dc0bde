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


@pytest.fixture
def measured_nowhere(
    main_window: Any,
    open_in_window: Any,
    whatif_config: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Any:
    """``main_window`` showing the what-if config, with an empty probe cache (nothing timed on
    this machine yet); returns the opened model."""
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    return open_in_window(main_window, whatif_config)


def test_a_prediction_for_this_machine_says_when_its_host_costs_are_typical(
    main_window: Any, measured_nowhere: Any, test_profile: Any
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


def test_a_prediction_for_this_machine_says_when_its_attention_is_not_timed(
    main_window: Any, measured_nowhere: Any, test_profile: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This machine measured, a model whose attention its CPU has not timed: the speed model
    counts that attention's FLOPs until the model's first run times it (a 60M float16 Llama
    showed 114 tok/s, then 81.5 with its attention timed), and the label says so; once the
    shapes are timed, or the map runs on a GPU, it does not."""
    from dataclasses import replace

    from workbench.gui.window_hardware import ATTENTION_ESTIMATED
    from workbench.models import attention_probe
    from workbench.models.attention_probe import AttentionTimes, cached_attention_times
    from workbench.models.dispatch_probe import DispatchOverhead
    from workbench.models.hardware import DETECTED_NAME, with_dispatch_overhead
    from workbench.models.matmul_probe import MatmulCurve
    from workbench.models.speed import attention_shapes_for
    from workbench.runtime.planning import attention_layout
    from workbench.runtime.precision_session import planned_tree

    opened = measured_nowhere
    curve = MatmulCurve({"float32": [[2**20, 2e-4], [2**22, 6e-4]]}, 2, 0.0)
    here = with_dispatch_overhead(
        replace(test_profile, name=DETECTED_NAME, cpu_matmul_curve=curve),
        DispatchOverhead(21e-6, 0.4e-3, 2, 0.0),
    )
    main_window.hardware.set_hardware_profile(here)
    label = main_window.speed_label
    main_window.session.set_device_map({"": 0})
    main_window.update_speed_prediction(wait=True)
    assert "Predicted for this machine" in label.text()
    assert ATTENTION_ESTIMATED not in label.text()  # a GPU runs it: no CPU attention probe

    main_window.session.set_device_map({"": "cpu"})
    main_window.update_speed_prediction(wait=True)
    assert ATTENTION_ESTIMATED in label.text()

    shapes = attention_shapes_for(planned_tree(main_window.session), attention_layout(opened))
    timed = AttentionTimes([[512, 1e-4], [4096, 1e-3]], [[256, 1e-3], [2048, 5e-2]], 0.0)
    monkeypatch.setattr(attention_probe, "measure_attention_times_apart", lambda shape: timed)
    assert len(cached_attention_times(shapes)) == len({s.key for s in shapes})  # as a run does
    main_window.update_speed_prediction(wait=True)
    assert "Predicted for this machine" in label.text()
    assert ATTENTION_ESTIMATED not in label.text()
