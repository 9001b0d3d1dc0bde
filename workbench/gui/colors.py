"""The app's one palette: one colour per device, the same everywhere (tree chips, lanes, plot
lines, cluster stages), and the few status colours (over budget, reserve, pass/fail, warnings).

Colours are picked to stay readable on light and dark palettes (mid-saturation hues). GPUs
cycle through a fixed list by index, so ``cuda:0`` is always the same blue in every widget and
plot of the app.

Example:
    >>> from workbench.gui.colors import device_color
    >>> device_color(0).name()  # doctest: +SKIP
    '#3b82f6'
"""

from __future__ import annotations

from PySide6.QtGui import QColor

from workbench.runtime import normalize_device

_GPU_HEXES = (
    "#3b82f6",  # blue
    "#10b981",  # green
    "#8b5cf6",  # violet
    "#f59e0b",  # amber
    "#ec4899",  # pink
    "#14b8a6",  # teal
    "#6366f1",  # indigo
    "#84cc16",  # lime
)
_NAMED_HEXES = {
    "cpu": "#f97316",  # orange
    "disk": "#78716c",  # stone grey
    "mps": "#0ea5e9",  # sky
    "meta": "#a1a1aa",  # zinc
}
_PSEUDO_HEXES = {
    "system": "#a1a1aa",  # the system's own figures (available memory) in the plots
}
_UNKNOWN_HEX = "#a1a1aa"
OVER_BUDGET_HEX = "#dc2626"  # red: over-budget lanes, invalid maps
RESERVE_HEX = "#fbbf24"  # the reserved share of a lane's capacity bar
MIXED_HEX = "#9ca3af"  # a module whose subtree is split over several devices
PASS_HEX = "#15803d"  # a verify that passed
FAIL_HEX = "#b91c1c"  # a verify that failed
WARNING_HEX = "#b45309"  # stale results, warnings next to a control


def device_color(device: int | str | object) -> QColor:
    """Return the colour of ``device`` (any device value: ``0``, ``"cuda:1"``, ``"cpu"``, ...).

    Args:
        device: a device value as accepted by ``normalize_device``, or ``"system"``.

    Returns:
        A new ``QColor``; unknown or invalid devices get a neutral grey.

    Example:
        >>> device_color("cuda:0") == device_color(0)  # doctest: +SKIP
        True
    """
    pseudo = _PSEUDO_HEXES.get(device) if isinstance(device, str) else None
    if pseudo is not None:
        return QColor(pseudo)
    try:
        canonical = normalize_device(device)  # type: ignore[arg-type]
    except ValueError:
        return QColor(_UNKNOWN_HEX)
    if isinstance(canonical, int):
        return QColor(_GPU_HEXES[canonical % len(_GPU_HEXES)])
    return QColor(_NAMED_HEXES.get(canonical.split(":")[0], _UNKNOWN_HEX))


def stage_color(stage_index: int) -> QColor:
    """Return the colour of pipeline stage ``stage_index`` (the GPU colours, by index), the
    same in the cluster view's lanes and the module tree's stage bands."""
    return QColor(_GPU_HEXES[stage_index % len(_GPU_HEXES)])


def text_color_on(background: QColor) -> QColor:
    """Return black or white, whichever reads better on ``background``."""
    luminance = 0.299 * background.redF() + 0.587 * background.greenF() + 0.114 * background.blueF()
    return QColor("#000000") if luminance > 0.6 else QColor("#ffffff")


def over_budget_color() -> QColor:
    """Return the colour of over-budget lanes and invalid-map badges."""
    return QColor(OVER_BUDGET_HEX)


def reserve_color() -> QColor:
    """Return the colour of the reserved share of a capacity bar."""
    return QColor(RESERVE_HEX)


def mixed_color() -> QColor:
    """Return the colour of a module whose subtree spans several devices."""
    return QColor(MIXED_HEX)


def pass_color(passed: bool) -> QColor:
    """Return the colour of a verify result: green when it passed, red when it failed."""
    return QColor(PASS_HEX if passed else FAIL_HEX)


def warning_color() -> QColor:
    """Return the colour of warnings and stale-result labels."""
    return QColor(WARNING_HEX)
