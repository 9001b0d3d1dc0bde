"""One palette: every widget and plot gives a device the same colour."""

from __future__ import annotations

import pytest

from workbench.gui.colors import (
    FAIL_HEX,
    PASS_HEX,
    device_color,
    pass_color,
    text_color_on,
)
from workbench.gui.plots import device_qcolor

pytestmark = pytest.mark.gui


@pytest.mark.parametrize("device", [0, "0", "cuda:0", 1, "cuda:7", 9, "cpu", "disk", "mps", "meta"])
def test_plots_use_the_palette_of_the_tree_and_lanes(device: int | str) -> None:
    assert device_qcolor(device).name() == device_color(device).name()


def test_spellings_of_one_device_share_a_colour_and_devices_differ() -> None:
    assert device_color("cuda:1").name() == device_color(1).name() == device_color("1").name()
    names = {device_color(d).name() for d in (0, 1, 2, "cpu", "disk")}
    assert len(names) == 5


def test_pseudo_and_unknown_devices_get_a_neutral_grey() -> None:
    grey = device_color("not-a-device").name()
    assert device_color("system").name() == grey == device_qcolor("system").name()
    assert grey not in {device_color(d).name() for d in (0, 1, "cpu", "disk")}


def test_status_colours_come_from_the_palette() -> None:
    assert pass_color(True).name() == PASS_HEX and pass_color(False).name() == FAIL_HEX
    assert text_color_on(device_color(0)).name() in ("#000000", "#ffffff")
