"""The planner panel's comparison table: exactly as tall as its rows, and its status cells.

``status_item`` says ok / over budget / does not fit / cannot load / not here / plan only for
one candidate, with the details in its tooltip; ``over_budget`` names the devices where the
plan's weights plus its reserve exceed a budget (what the lanes flag).
"""

from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QSizePolicy, QTableWidget, QTableWidgetItem, QWidget

from workbench.gui.colors import warning_color
from workbench.runtime import device_label
from workbench.runtime.formatting import format_nbytes
from workbench.runtime.strategy_compare import Candidate, PlanRequest

WARNING_COLOR = warning_color()


class RowsTable(QTableWidget):
    """A table exactly as tall as its header and rows (plus a scroll bar when too wide)."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.verticalHeader().setDefaultSectionSize(self.fontMetrics().lineSpacing() + 6)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self._too_wide = False

    def sizeHint(self) -> QSize:
        frame = 2 * self.frameWidth()
        height = self.horizontalHeader().sizeHint().height() + self.verticalHeader().length()
        if self._content_width() > self.width():
            height += self.horizontalScrollBar().sizeHint().height()
        return QSize(super().sizeHint().width(), height + frame)

    def minimumSizeHint(self) -> QSize:
        return QSize(super().minimumSizeHint().width(), self.sizeHint().height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        too_wide = self._content_width() > self.width()
        if too_wide != self._too_wide:  # the scroll bar comes or goes: make room for it
            self._too_wide = too_wide
            self.updateGeometry()

    def _content_width(self) -> int:
        header = self.verticalHeader()
        width = header.sizeHint().width() if header.isVisible() else 0
        return width + self.horizontalHeader().length() + 2 * self.frameWidth()


def status_item(candidate: Candidate, request: PlanRequest | None) -> QTableWidgetItem:
    """The status cell: ok / does not fit / cannot load, the number of warnings; details in
    the tooltip. "ok" means the plan fits, its reserve too (as the lanes count it), and the
    shared load check accepts its map."""
    prediction = candidate.prediction
    check = candidate.load_check
    details = [candidate.error or (prediction.summary() if prediction else "")]
    over = over_budget(candidate, request)
    if not candidate.plan:
        text = "does not fit"
    elif check is not None and not check.map_valid:
        text = "cannot load"
    elif over:
        text = "over budget"
        details.append(over)
    elif check is not None and check.device_problems:
        text = "not here"  # fits, on devices this machine lacks (the tooltip lists them)
    elif check is not None and check.weight_problems:
        text = "plan only"  # no weights to load
    else:
        text = "ok"
    if check is not None and check.problems:
        details.append(check.reason)
    if candidate.warnings:
        count = len(candidate.warnings)
        text += f", {count} warning" + ("s" if count > 1 else "")
        details += [f"warning: {w}" for w in candidate.warnings]
    item = QTableWidgetItem(text)
    item.setToolTip("\n".join(d for d in details if d))
    if candidate.warnings or over or (check is not None and not check.map_valid):
        item.setForeground(WARNING_COLOR)
    return item


def over_budget(candidate: Candidate, request: PlanRequest | None) -> str:
    """Where the plan's weights plus the reserve exceed a budget (what the lanes flag), or ""."""
    if candidate.plan is None or request is None:
        return ""
    over = []
    for device, budget in request.budgets.items():
        plan = candidate.plan
        used = plan.per_device_bytes.get(device, 0) + plan.reserve.get(device, 0)
        if used > budget:
            over.append(
                f"{device_label(device)}: {format_nbytes(used)} with the reserve, budget "
                f"{format_nbytes(budget)}"
            )
    return "over budget on " + "; ".join(over) if over else ""
