"""The files under ``resources/`` that the app, the desktop entry and the bundle rely on: the
app icon (SVG and its PNG renderings, kept in step), the ``.desktop`` entry, and the one
resource helper that finds them."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest
import tomllib

from workbench import APP_ID, APP_NAME
from workbench.platform_integration import ICON_SIZES_PX, render_icon_image, render_icon_pngs
from workbench.resources import resource_path, resources_root

ROOT = Path(__file__).resolve().parent.parent
HICOLOR = resources_root() / "icons" / "hicolor"


def _load(path: Path):
    from PySide6.QtGui import QImage

    image = QImage(str(path))
    assert not image.isNull(), f"{path} is not a readable image"
    return image.convertToFormat(QImage.Format.Format_ARGB32)


def test_every_freedesktop_size_is_shipped_as_a_square_png_with_alpha(qapp):
    shipped = sorted(int(p.parent.parent.name.split("x")[0]) for p in HICOLOR.glob("*/apps/*.png"))
    assert shipped == sorted(ICON_SIZES_PX)
    assert min(shipped) == 16
    assert max(shipped) == 256
    for size_px in ICON_SIZES_PX:
        png = HICOLOR / f"{size_px}x{size_px}" / "apps" / f"{APP_ID}.png"
        image = _load(png)
        assert (image.width(), image.height()) == (size_px, size_px)
        assert image.hasAlphaChannel()
        assert image.pixelColor(0, 0).alpha() == 0  # rounded corner: transparent
        assert image.pixelColor(size_px // 2, size_px // 2).alpha() == 255


def test_pngs_are_up_to_date_with_the_svg(qapp):
    """A changed app.svg must be re-rendered: `scripts/build-app --icons-only`."""
    svg = resource_path("icons", "app.svg")
    for size_px in ICON_SIZES_PX:
        shipped = _load(HICOLOR / f"{size_px}x{size_px}" / "apps" / f"{APP_ID}.png")
        fresh = render_icon_image(svg, size_px)
        diffs = [
            abs(
                (shipped.pixelColor(x, y).rgba() >> shift & 0xFF)
                - (fresh.pixelColor(x, y).rgba() >> shift & 0xFF)
            )
            for x in range(size_px)
            for y in range(0, size_px, max(1, size_px // 32))
            for shift in (0, 8, 16, 24)
        ]
        mean_abs_diff = sum(diffs) / len(diffs)
        # identical on the same Qt; a few levels of antialiasing drift across Qt versions
        assert mean_abs_diff < 2.0, f"{size_px}px icon is stale (mean diff {mean_abs_diff:.1f})"


def test_render_icon_pngs_writes_the_hicolor_layout(qapp, tmp_path):
    written = render_icon_pngs(resource_path("icons", "app.svg"), tmp_path, sizes_px=(20, 40))
    assert written == [
        tmp_path / "20x20" / "apps" / f"{APP_ID}.png",
        tmp_path / "40x40" / "apps" / f"{APP_ID}.png",
    ]
    assert _load(written[1]).width() == 40
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [f"{APP_ID}.png"] * 2


def test_render_icon_pngs_rewrites_only_pngs_whose_bytes_change(qapp, tmp_path):
    """So `scripts/build-app` never dirties the tracked icons when the SVG is unchanged."""
    svg = resource_path("icons", "app.svg")
    small, large = render_icon_pngs(svg, tmp_path, sizes_px=(20, 40))
    stamps = {p: p.stat().st_mtime_ns for p in (small, large)}
    assert render_icon_pngs(svg, tmp_path, sizes_px=(20, 40)) == []
    assert {p: p.stat().st_mtime_ns for p in (small, large)} == stamps
    small.write_bytes(b"stale")
    assert render_icon_pngs(svg, tmp_path, sizes_px=(20, 40)) == [small]
    assert _load(small).width() == 20
    assert large.stat().st_mtime_ns == stamps[large]


def test_render_rejects_a_file_that_is_not_svg(qapp, tmp_path):
    bogus = tmp_path / "broken.svg"
    bogus.write_text("<svg this is not xml")
    with pytest.raises(ValueError, match=r"broken\.svg"):
        render_icon_image(bogus, 16)


def test_app_svg_is_square_and_titled():
    from xml.etree import ElementTree

    root = ElementTree.parse(resource_path("icons", "app.svg")).getroot()
    assert root.get("viewBox") == "0 0 256 256"
    title = root.find("{http://www.w3.org/2000/svg}title")
    assert title is not None
    assert title.text == APP_NAME


def test_desktop_entry_is_named_after_the_app_id_and_launches_the_console_script():
    entry = resource_path(f"{APP_ID}.desktop")
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str
    parser.read(entry, encoding="utf-8")
    section = parser["Desktop Entry"]
    assert section["Name"] == APP_NAME
    assert section["Icon"] == APP_ID  # found in hicolor, installed under the same name
    assert section["Type"] == "Application"
    assert section["Terminal"] == "false"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert section["Exec"].split()[0] in scripts
    for action in section["Actions"].strip(";").split(";"):
        assert parser[f"Desktop Action {action}"]["Exec"].split()[0] in scripts


def test_resource_helper_finds_everything_the_app_and_bundle_need():
    assert resources_root().is_dir()
    for parts in (
        ("icons", "app.svg"),
        (f"{APP_ID}.desktop",),
        ("styles", "workbench.qss"),
        ("configs", "tiny-llama-demo.json"),
    ):
        assert resource_path(*parts).is_file()
    assert list((resources_root() / "hardware").glob("*.json"))
    with pytest.raises(FileNotFoundError, match=r"no-such-icon\.svg"):
        resource_path("icons", "no-such-icon.svg")


@pytest.mark.gui
def test_application_identity_matches_the_desktop_entry(qapp):
    from workbench.gui.app import configure_application

    configure_application(qapp)
    assert qapp.desktopFileName() == APP_ID  # docks and Wayland match the window by this
    assert qapp.applicationName() == APP_NAME
    assert not qapp.windowIcon().isNull()
