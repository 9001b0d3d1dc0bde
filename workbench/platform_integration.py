"""Operating-system identity for the desktop app, the frozen bundle's entry point, and the
icon renderer that turns ``resources/icons/app.svg`` into the freedesktop PNG sizes.

- Windows groups taskbar buttons and pins shortcuts by AppUserModelID; a Python process
  otherwise shows up as "python.exe". :func:`set_windows_app_user_model_id` sets ours
  (``workbench.APP_ID``) and is a no-op on other systems.
- :func:`install_smoke_test` is the bundle check's hook (``workbench.bundle.bundle_main``, what
  the PyInstaller bundle runs, installs it for GUI launches).

Qt is imported lazily, inside the functions that need it.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from workbench import APP_ID
from workbench.big_modeling.atomic import atomic_write_bytes

logger = logging.getLogger(__name__)

ICON_SIZES_PX: tuple[int, ...] = (16, 22, 24, 32, 48, 64, 128, 256)
SMOKE_ENV = "WORKBENCH_SMOKE_TEST"
SMOKE_TIMEOUT_ENV = "WORKBENCH_SMOKE_TIMEOUT_S"
SMOKE_FAILED_EXIT = 3
_SMOKE_POLL_MS = 100


def set_windows_app_user_model_id(app_id: str = APP_ID) -> bool:
    """Give this process an explicit Windows AppUserModelID so the taskbar shows our icon.

    Call it before the first window is created. Elsewhere it does nothing.

    Args:
        app_id: the identifier; the Start-menu shortcut must carry the same one
            (``System.AppUserModel.ID``) for pinning to work.

    Returns:
        True when Windows accepted the identifier, False on other systems or on failure
        (logged, never raised: a missing identity only costs the taskbar icon).

    Example:
        >>> set_windows_app_user_model_id()  # doctest: +SKIP
        True
    """
    if sys.platform != "win32":
        return False
    try:
        shell32 = ctypes.windll.shell32  # type: ignore[attr-defined]
        result = shell32.SetCurrentProcessExplicitAppUserModelID(ctypes.c_wchar_p(app_id))
    except (AttributeError, OSError) as exc:
        logger.warning("could not set the Windows AppUserModelID %s: %s", app_id, exc)
        return False
    if result != 0:  # an HRESULT: 0 is S_OK
        logger.warning(
            "SetCurrentProcessExplicitAppUserModelID returned 0x%08x", result & 0xFFFFFFFF
        )
        return False
    return True


def render_icon_pngs(
    svg_path: Path, hicolor_dir: Path, sizes_px: Iterable[int] = ICON_SIZES_PX
) -> list[Path]:
    """Render ``svg_path`` to ``hicolor_dir/<N>x<N>/apps/<APP_ID>.png`` for each size.

    A PNG whose bytes would not change is left alone, so re-rendering the tracked icons
    never dirties a checkout. Needs a ``QGuiApplication`` (offscreen is fine); one is
    created if none exists.

    Args:
        svg_path: the app icon in SVG.
        hicolor_dir: the ``hicolor`` theme folder to write into.
        sizes_px: square edge lengths in pixels.

    Returns:
        The PNG paths (re)written, in the order of ``sizes_px``; up-to-date ones are left out.

    Raises:
        ValueError: when Qt cannot parse ``svg_path``.
        OSError: when a PNG cannot be encoded or written.

    Example:
        >>> render_icon_pngs(Path("resources/icons/app.svg"), Path("resources/icons/hicolor"))  # doctest: +SKIP
    """
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QSize  # noqa: PLC0415 (Qt only when icons are rendered)
    from PySide6.QtGui import QGuiApplication  # noqa: PLC0415 (Qt only when icons are rendered)

    _app = QGuiApplication.instance() or QGuiApplication([])
    written: list[Path] = []
    for size_px in sizes_px:
        image = render_icon_image(svg_path, size_px)
        assert image.size() == QSize(size_px, size_px)
        target = hicolor_dir / f"{size_px}x{size_px}" / "apps" / f"{APP_ID}.png"
        encoded = QByteArray()
        buffer = QBuffer(encoded)
        buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        if not image.save(buffer, "PNG"):
            raise OSError(f"could not encode the {size_px}px icon for {target}")
        png = encoded.data()
        if target.is_file() and target.read_bytes() == png:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, png)
        target.chmod(0o644)  # icons are world-readable whatever the umask
        written.append(target)
    return written


def render_icon_image(svg_path: Path, size_px: int) -> object:
    """Return a ``QImage`` (ARGB32, transparent background) of the SVG at ``size_px`` square.

    Raises:
        ValueError: when Qt cannot parse the SVG.
    """
    from PySide6.QtCore import Qt  # noqa: PLC0415 (Qt only when icons are rendered)
    from PySide6.QtGui import QImage, QPainter  # noqa: PLC0415 (Qt only when icons are rendered)
    from PySide6.QtSvg import QSvgRenderer  # noqa: PLC0415 (Qt only when icons are rendered)

    renderer = QSvgRenderer(str(svg_path))
    if not renderer.isValid():
        raise ValueError(f"{svg_path} is not an SVG that Qt can render; check the XML")
    image = QImage(size_px, size_px, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    return image.convertToFormat(QImage.Format.Format_ARGB32)


def install_smoke_test(timeout_s: float) -> None:
    """Create the ``QApplication`` now and make it quit once a model is open in the window.

    Used by the bundle check: the event loop exits with 0 once the main window shows an
    opened model (a line naming it goes to stderr), or with ``SMOKE_FAILED_EXIT`` after
    ``timeout_s``. ``run_app`` then reuses this application.
    """
    from PySide6.QtCore import QTimer  # noqa: PLC0415 (Qt only for a GUI launch)
    from PySide6.QtWidgets import QApplication  # noqa: PLC0415 (Qt only for a GUI launch)

    app = QApplication.instance() or QApplication(sys.argv)
    deadline_s = time.monotonic() + timeout_s
    timer = QTimer(app)
    timer.setInterval(_SMOKE_POLL_MS)

    def _on_timer_timeout() -> None:
        for widget in app.topLevelWidgets():
            session = getattr(widget, "session", None)
            tree = getattr(session, "tree", None)
            if tree is not None and widget.isVisible():
                timer.stop()
                sys.stderr.write(
                    f"smoke test: opened {session.source} ({len(tree)} modules) "
                    f"in {widget.windowTitle()!r}\n"
                )
                app.exit(0)
                return
        if time.monotonic() > deadline_s:
            timer.stop()
            sys.stderr.write(f"smoke test: no model open after {timeout_s:.0f} s\n")
            app.exit(SMOKE_FAILED_EXIT)

    timer.timeout.connect(_on_timer_timeout)
    timer.start()
