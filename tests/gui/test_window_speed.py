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
