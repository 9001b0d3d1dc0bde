"""The desktop app (PySide6 + pyqtgraph). Nothing outside this package imports it."""

from workbench.gui.pyside_compat import make_singletons_immortal

make_singletons_immortal()
