"""Look and feel of the main window: the system palette (light and dark), toolbar and window
icons from ``resources/``, the Hugging Face cache browser, and the detected-hardware profile."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hub_cache import make_hub_cache_entry
from PySide6.QtCore import QByteArray, QSize, Qt
from PySide6.QtGui import QColor, QIcon, QImage, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication, QDialogButtonBox

from workbench.resources import resource_path

pytestmark = pytest.mark.gui

ICON_PX = 24
TOOLBAR_ICON_FILES = {  # action name -> resources/icons/<file>.svg
    "open_config": "open",
    "plan": "plan",
    "import_map": "import-map",
    "export_map": "export-map",
    "copy_code": "copy-code",
    "diff_file": "diff",
    "undo": "undo",
    "redo": "redo",
}


def _dark_palette() -> QPalette:
    palette = QPalette()
    roles = {
        QPalette.ColorRole.Window: "#202124",
        QPalette.ColorRole.WindowText: "#e8eaed",
        QPalette.ColorRole.Base: "#121212",
        QPalette.ColorRole.AlternateBase: "#2a2a2a",
        QPalette.ColorRole.Text: "#f1f3f4",
        QPalette.ColorRole.Button: "#303134",
        QPalette.ColorRole.ButtonText: "#e8eaed",
        QPalette.ColorRole.Mid: "#5f6368",
        QPalette.ColorRole.Highlight: "#8ab4f8",
        QPalette.ColorRole.HighlightedText: "#202124",
    }
    for role, hex_color in roles.items():
        palette.setColor(role, QColor(hex_color))
    return palette


@pytest.fixture
def app_palette(qapp: QApplication) -> Iterator[QApplication]:
    """The application; its palette is put back after the test."""
    saved = QPalette(qapp.palette())
    try:
        yield qapp
    finally:
        qapp.setPalette(saved)


def _center_color(widget: Any) -> QColor:
    image = widget.grab().toImage()
    return QColor(image.pixel(image.width() // 2, image.height() // 2))


def _opaque_colors(icon: QIcon) -> set[str]:
    """The colours of the fully opaque pixels of the icon at toolbar size."""
    image = icon.pixmap(QSize(ICON_PX, ICON_PX)).toImage()
    image = image.convertToFormat(QImage.Format.Format_ARGB32)
    return {
        QColor(image.pixel(x, y)).name()
        for x in range(image.width())
        for y in range(image.height())
        if QColor.fromRgba(image.pixel(x, y)).alpha() == 255
    }


def _alpha_mask(image: QImage) -> list[bool]:
    image = image.convertToFormat(QImage.Format.Format_ARGB32)
    return [
        QColor.fromRgba(image.pixel(x, y)).alpha() > 0
        for y in range(image.height())
        for x in range(image.width())
    ]


def _render_resource_svg(name: str) -> QImage:
    """Render ``resources/icons/<name>.svg`` at toolbar size, independently of the app."""
    svg = resource_path("icons", f"{name}.svg").read_bytes()
    pixmap = QPixmap(QSize(ICON_PX, ICON_PX))
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    QSvgRenderer(QByteArray(svg)).render(painter)
    painter.end()
    return pixmap.toImage()


def _new_window(qtbot: Any, **kwargs: Any) -> Any:
    from workbench.gui.main_window import MainWindow

    errors: list[tuple[str, str]] = []
    window = MainWindow(show_error=lambda title, text: errors.append((title, text)), **kwargs)
    qtbot.addWidget(window)
    window.errors = errors
    window.show()
    return window


# --- palette -------------------------------------------------------------------------------


def test_lane_bars_repaint_with_the_palette_light_and_dark(qtbot, app_palette, tiny_window) -> None:
    bar = tiny_window.lanes.lane("disk").bar  # an empty lane: the bar is all background
    light_base = app_palette.palette().base().color()
    assert _center_color(bar).name() == light_base.name()

    dark = _dark_palette()
    app_palette.setPalette(dark)  # widgets get the change through posted events
    qtbot.waitUntil(lambda: bar.palette().base().color().name() == "#121212", timeout=5000)
    dark_color = _center_color(bar)
    assert dark_color.name() == "#121212"
    assert dark_color.name() != light_base.name()


def test_toolbar_icons_are_tinted_for_the_palette_the_window_starts_with(
    qtbot, app_palette, clean_settings, test_profile
) -> None:
    light_text = app_palette.palette().windowText().color().name()
    light = _new_window(qtbot, profiles=[test_profile])
    light_colors = _opaque_colors(light.actions_by_name["open_config"].icon())
    light.close()
    assert light_colors == {light_text}

    app_palette.setPalette(_dark_palette())
    dark = _new_window(qtbot, profiles=[test_profile])
    try:
        for name in TOOLBAR_ICON_FILES:
            assert _opaque_colors(dark.actions_by_name[name].icon()) == {"#e8eaed"}, name
    finally:
        dark.close()


def test_toolbar_icons_follow_a_palette_switch_while_running(
    qtbot, app_palette, main_window
) -> None:
    app_palette.setPalette(_dark_palette())
    qtbot.waitUntil(lambda: main_window.palette().windowText().color().name() == "#e8eaed")
    assert _opaque_colors(main_window.actions_by_name["open_config"].icon()) == {"#e8eaed"}


# --- icons ---------------------------------------------------------------------------------


def test_every_toolbar_action_has_its_icon_from_resources(main_window) -> None:
    toolbar = main_window.main_toolbar
    by_action = {id(action): name for name, action in main_window.actions_by_name.items()}
    # the runtime panels' text buttons, and Convert for loading beside them
    text_only = {"load_dispatch", "cancel", "unload", "convert_gguf"}
    buttons = [
        a
        for a in toolbar.actions()
        if not a.isSeparator() and by_action.get(id(a), "load_dispatch") not in text_only
    ]
    assert sorted(by_action[id(a)] for a in buttons) == sorted(TOOLBAR_ICON_FILES)
    for action in buttons:
        name = by_action[id(action)]
        icon = action.icon()
        assert not icon.isNull(), name
        assert QSize(ICON_PX, ICON_PX) in icon.availableSizes(), name
        image = icon.pixmap(QSize(ICON_PX, ICON_PX)).toImage()
        mask = _alpha_mask(image)
        assert any(mask), f"{name}: the icon draws nothing"
        expected = _alpha_mask(_render_resource_svg(TOOLBAR_ICON_FILES[name]))
        assert mask == expected, f"{name}: not the shape of {TOOLBAR_ICON_FILES[name]}.svg"
    masks = {
        tuple(_alpha_mask(a.icon().pixmap(QSize(ICON_PX, ICON_PX)).toImage())) for a in buttons
    }
    assert len(masks) == len(buttons), "two toolbar actions share an icon"


def test_window_icon_is_the_app_icon_from_resources(qapp, main_window) -> None:
    from workbench.gui.app import configure_application

    saved = (qapp.windowIcon(), qapp.styleSheet(), qapp.style().name())
    try:
        configure_application(qapp)
        window_icon = main_window.windowIcon()
        assert not window_icon.isNull()
        expected = QIcon(str(resource_path("icons", "app.svg"))).pixmap(QSize(64, 64)).toImage()
        assert window_icon.pixmap(QSize(64, 64)).toImage() == expected
    finally:
        qapp.setWindowIcon(saved[0])
        qapp.setStyleSheet(saved[1])
        qapp.setStyle(saved[2])


# --- Hugging Face cache browser --------------------------------------------------------------


def test_cache_browser_lists_the_cached_repo_and_opens_it(
    qtbot, main_window, demo_dir, tmp_path, monkeypatch
) -> None:
    from workbench.gui.cache_browser import CacheBrowser

    snapshot = make_hub_cache_entry(tmp_path / "hf-home" / "hub", "acme/tiny-llama", demo_dir)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))

    main_window.actions_by_name["hf_cache"].trigger()
    browser = main_window.findChild(CacheBrowser)
    assert browser is not None and browser.isVisible()
    items = [browser.list_widget.item(row) for row in range(browser.list_widget.count())]
    assert [item.data(Qt.ItemDataRole.UserRole) for item in items] == ["acme/tiny-llama"]
    assert items[0].text().startswith("acme/tiny-llama") and "weights" in items[0].text()
    assert browser.info_label.text().startswith("1 model(s)")

    browser.list_widget.setCurrentItem(items[0])
    buttons = browser.findChild(QDialogButtonBox)
    qtbot.mouseClick(
        buttons.button(QDialogButtonBox.StandardButton.Open), Qt.MouseButton.LeftButton
    )
    qtbot.waitUntil(
        lambda: main_window.session.opened is not None or bool(main_window.errors), timeout=60_000
    )
    qtbot.waitUntil(lambda: not main_window.open_thread.isRunning(), timeout=5000)
    assert not main_window.errors, main_window.errors
    assert main_window.session.source == "hf-cache:acme/tiny-llama"
    opened = main_window.session.opened
    assert Path(opened.folder) == snapshot and opened.checkpoint is not None
    assert main_window.tree_model.rowCount() > 0
    assert main_window.windowTitle().startswith("tiny-llama")


# --- detected hardware ---------------------------------------------------------------------


def test_detected_hardware_gives_this_machines_cpu_budget(qtbot, clean_settings) -> None:
    from workbench.models.hardware import detect_hardware

    window = _new_window(qtbot)  # the real profile list: detected first, then what-if ones
    try:
        selector = window.hardware_selector
        labels = [selector.itemText(i) for i in range(selector.count())]
        assert "This machine (detected)" in labels
        detected_at = labels.index("This machine (detected)")
        assert selector.itemData(detected_at) == "detected"
        other_at = next(i for i in range(selector.count()) if i != detected_at)

        selector.setCurrentIndex(other_at)  # what the user does: pick a what-if, then this machine
        whatif = selector.current_profile()
        assert window.session.profile.name == whatif.name
        assert window.session.budgets["cpu"] == whatif.budgets()["cpu"]

        selector.setCurrentIndex(detected_at)
        fresh = detect_hardware().budgets()
        assert window.session.profile.name == "detected"
        assert set(window.session.budgets) == set(fresh)
        assert window.session.budgets["cpu"] == pytest.approx(fresh["cpu"], rel=0.05)
        assert window.session.budgets["cpu"] != whatif.budgets()["cpu"]
        assert "cpu" in window.budget_editor.spin_boxes
        shown_gib = window.budget_editor.spin_boxes["cpu"].value()
        assert shown_gib == pytest.approx(fresh["cpu"] / 1024**3, rel=0.05)
    finally:
        window.close()


@pytest.mark.parametrize("width", [1400, 1440, 1600])
def test_first_run_planner_dock_shows_the_whole_form_without_sideways_scrolling(
    qtbot: Any, main_window: Any, width: int
) -> None:
    """1440: the first-run window on a 1600 x 1000 screen (nine tenths), where the form
    needed 535 px of a 480 px dock and its right edge was cut (Xvfb, stop 38)."""
    main_window.resize(width, 900)
    main_window._default_dock_sizes()
    scroll = main_window.planner_dock.widget()
    qtbot.waitUntil(
        lambda: scroll.viewport().width() >= main_window.planner_panel.minimumSizeHint().width()
    )
    assert not scroll.horizontalScrollBar().isVisible()
    # narrow enough that the tree and the lanes keep most of the window
    assert main_window.planner_panel.minimumSizeHint().width() <= width // 3
