"""Toolbar and menu icons from ``resources/icons``, tinted to the palette's text colour.

The SVGs are drawn in neutral grey; ``icon(name)`` renders them in the current text colour, so
they read well on light and dark palettes alike. A missing icon gives an empty ``QIcon`` and a
log line, never an exception.
"""

from __future__ import annotations

import logging
from functools import cache

from PySide6.QtCore import QByteArray, QSize, Qt
from PySide6.QtGui import QGuiApplication, QIcon, QPainter, QPixmap
from PySide6.QtSvg import QSvgRenderer

from workbench.resources import resources_root

logger = logging.getLogger(__name__)

_ICON_PX = 24


def icon(name: str) -> QIcon:
    """Return the icon ``resources/icons/<name>.svg`` tinted for the current palette.

    Example:
        >>> action.setIcon(icon("open"))  # doctest: +SKIP
    """
    palette = QGuiApplication.palette()
    return _tinted_icon(name, palette.windowText().color().name())


@cache
def _tinted_icon(name: str, color_hex: str) -> QIcon:
    path = resources_root() / "icons" / f"{name}.svg"
    if not path.is_file():
        logger.warning("icon %s not found under %s", name, path.parent)
        return QIcon()
    svg = path.read_text(encoding="utf-8").replace("#808080", color_hex)
    renderer = QSvgRenderer(QByteArray(svg.encode("utf-8")))
    result = QIcon()
    for scale in (1, 2):
        pixmap = QPixmap(QSize(_ICON_PX * scale, _ICON_PX * scale))
        pixmap.fill(Qt.GlobalColor.transparent)
        painter = QPainter(pixmap)
        renderer.render(painter)
        painter.end()
        result.addPixmap(pixmap)
    return result
