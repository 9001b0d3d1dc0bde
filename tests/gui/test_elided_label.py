"""A status too long for its label shows its start and an ellipsis, not its end."""

from __future__ import annotations

from typing import Any

import pytest
from PySide6.QtCore import Qt

from workbench.gui.elided_label import ElidedLabel

pytestmark = pytest.mark.gui

MESSAGE = (
    "infer failed: /tmp/gpt2: the prompt's 600 tokens and 16 new ones need 615 positions, but "
    "the model has learned position embeddings for 512 (max_position_embeddings)"
)


def test_a_long_text_shows_its_start_and_an_ellipsis(qtbot: Any) -> None:
    label = ElidedLabel(MESSAGE)
    qtbot.addWidget(label)
    label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    label.setFixedWidth(200)
    shown = label.shown_text()
    assert shown.startswith("infer failed") and shown.endswith("…") and len(shown) < len(MESSAGE)
    assert label.text() == MESSAGE  # the whole text for tests, tooltips and copies
    assert not label.grab().isNull()  # it paints
    label.setFixedWidth(2000)
    assert label.shown_text() == MESSAGE  # it fits: all of it


def test_the_inference_panels_status_is_elided(main_window: Any) -> None:
    status = main_window.runtime_panels.inference_panel.status_label
    assert isinstance(status, ElidedLabel)
