"""The hardware combo's item tooltips say how each profile's budgets are made, as
``workbench profiles`` prints them."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from workbench.gui.hardware_selector import HardwareSelector
from workbench.models.hardware import load_profile

pytestmark = pytest.mark.gui


def test_each_item_tooltip_names_the_profile_budgets(qtbot) -> None:
    profiles = [load_profile("rtx4090-64gb"), load_profile("cpu-laptop-16gb")]
    selector = HardwareSelector()
    qtbot.addWidget(selector)
    selector.set_profiles(profiles)
    tips = [selector.itemData(i, Qt.ItemDataRole.ToolTipRole) for i in range(selector.count())]
    assert tips == [f"{p.description}\n{p.budget_description()}" for p in profiles]
    assert "budgets: cuda:0 24 GiB - " in tips[0] and tips[1].endswith("budgets: full memory")
