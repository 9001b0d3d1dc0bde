"""Tools > What fits where: every hardware profile by context length for the open model.

A table, one row per hardware profile (this machine as the window lists it, with its measured
figures, then the bundled and the user's profiles), one column per context length
(4k, 32k, 128k and the model's maximum): each cell says full GPU, partial offload (how many
layers on the GPUs), CPU only or does not fit, with the predicted decode tok/s and time to
first token; its tooltip gives the memory model's reasons. The table is computed by
``workbench.runtime.fit_table`` on a worker thread (a 70B config takes a few seconds).

Double-clicking a cell that fits, or selecting it and pressing Apply, switches the window to
that profile and its plan as one undo step ("Use h200-141gb at 32k (what fits where)"): the
profile with its budgets, the reserve of the execution device, the device map.

Example:
    >>> dialog = show_fit_table(window)  # doctest: +SKIP
    >>> dialog.wait_until_computed()  # doctest: +SKIP
    >>> dialog.apply_cell(0, 0)  # doctest: +SKIP
    True
"""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import QCoreApplication, Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from workbench.gui.colors import (
    device_color,
    over_budget_color,
    pass_color,
    text_color_on,
    warning_color,
)
from workbench.gui.commands import SetBudgetsCommand, SetDeviceMapCommand, SetProfileCommand
from workbench.gui.window_hardware import UNMEASURED_HOST
from workbench.gui.workers import TaskThread
from workbench.models.hardware import DETECTED_NAME, host_probes_applied, list_profiles
from workbench.runtime.fit_table import (
    CPU_ONLY,
    FULL_GPU,
    PARTIAL,
    FitCell,
    FitTable,
    context_label,
    fit_table,
)
from workbench.wording import plural, with_article

logger = logging.getLogger(__name__)

CELL_ROLE = Qt.ItemDataRole.UserRole + 1


def status_color(status: str) -> QColor:
    """The background of a cell: green full GPU, amber partial, the CPU's colour, red."""
    if status == FULL_GPU:
        return pass_color(True)
    if status == PARTIAL:
        return warning_color()
    if status == CPU_ONLY:
        return device_color("cpu")
    return over_budget_color()


def cell_tooltip(cell: FitCell) -> str:
    """What a cell's tooltip says: the status, speed, reserves per device, problems."""
    where = profile_label(cell.profile, capital=True)  # "This machine", not "detected"
    lines = [f"{where} at {context_label(cell.context)} context: {cell.label()}"]
    if cell.speed_text():
        if cell.generates:
            why = f"TTFT for {with_article(f'{cell.context}-token prompt')}"
        else:
            why = f"over {cell.context} input tokens; the model generates no tokens"
        lines.append(f"Predicted {cell.speed_text()} ({why})")
    lines.extend(cell.why)
    if cell.problem:
        lines.append(cell.problem)
    lines.extend(cell.notes)
    if cell.fits:
        lines.append("Double-click (or Apply) to use this profile and plan")
    return "\n".join(lines)


class FitDialog(QDialog):
    """The what-fits-where table of the window's open model.

    Args:
        window: the main window (its session, undo stack and hardware part).

    Attributes:
        table: the computed ``FitTable``, ``None`` while it is computed.
        thread: the worker computing it.
        grid: the ``QTableWidget`` (rows: profiles, columns: contexts).
    """

    def __init__(self, window: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent or window)
        self.setObjectName("fitDialog")
        self.window_ = window
        self.table: FitTable | None = None
        self.thread: TaskThread | None = None
        self._opened = window.session.opened
        name = getattr(self._opened, "label", "the model")
        self.setWindowTitle(f"What fits where — {name}")
        self.status_label = QLabel(f"Planning {name} on every hardware profile…", self)
        self.status_label.setWordWrap(True)
        self.grid = QTableWidget(0, 0, self)
        self.grid.setObjectName("fitGrid")
        self.grid.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.grid.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.grid.setWordWrap(True)
        self.grid.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.grid.cellDoubleClicked.connect(self._on_grid_double_clicked)
        self.grid.itemSelectionChanged.connect(self._on_grid_selection_changed)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        self.apply_button = QPushButton("Apply", self)
        self.apply_button.setObjectName("fitApplyButton")
        self.apply_button.setEnabled(False)
        self.apply_button.setToolTip("Use the selected profile and its plan (one undo step)")
        buttons.addButton(self.apply_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.apply_button.clicked.connect(self._on_apply_clicked)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.status_label)
        layout.addWidget(self.grid, 1)
        layout.addWidget(buttons)
        self.resize(1100, 420)

    # --- computing ----------------------------------------------------------------------

    def start(self) -> TaskThread:
        """Compute the table on a worker thread; the grid fills when it is done."""
        thread = TaskThread(fit_table, self._opened, self._profiles())
        thread.setObjectName("fit table")
        thread.succeeded.connect(self._on_thread_succeeded)
        thread.failed.connect(self._on_thread_failed)
        self.thread = thread
        thread.start()
        return thread

    def _profiles(self) -> list[Any]:
        """This machine as the window lists it (with its measured figures), then every bundled
        and user profile (read now: one saved since the window opened is in)."""
        selector = getattr(self.window_, "hardware_selector", None)
        detected = selector.profile(DETECTED_NAME) if selector is not None else None
        saved = [p for p in list_profiles() if p.name != DETECTED_NAME]
        return [detected, *saved] if detected is not None else saved

    def wait_until_computed(self) -> None:
        """Block until the table is shown (scripts and tests)."""
        if self.thread is not None:
            self.thread.wait()
            QCoreApplication.sendPostedEvents()  # deliver the queued result now

    def _on_thread_succeeded(self, table: FitTable) -> None:
        self.table = table
        elapsed = self.thread.elapsed_s if self.thread is not None else 0.0
        warnings = f" Warnings: {'; '.join(table.warnings)}" if table.warnings else ""
        if all(cell.generates for cell in table.cells):
            speed = "TTFT is the prefill of a prompt that fills the context"
        else:  # an encoder: its only run is one forward
            speed = "The model generates no tokens: its speed is one forward over the context"
        typical = any(
            p.name == DETECTED_NAME and not host_probes_applied(p) for p in table.profiles
        )
        host = f" This machine's speeds use {UNMEASURED_HOST}." if typical else ""
        self.status_label.setText(
            f"{table.model}: {plural(len(table.profiles), 'hardware profile')} x "
            f"{plural(len(table.contexts), 'context length')}, planned in {elapsed:.1f} s with "
            f"the KV cache and activations of each context. {speed}.{host} Double-click a cell "
            f"to use that profile and plan.{warnings}"
        )
        self._fill(table)

    def _on_thread_failed(self, exc: BaseException) -> None:
        logger.warning("fit table failed: %s", exc)
        self.status_label.setText(f"Cannot compute what fits where: {exc}")

    def _fill(self, table: FitTable) -> None:
        grid = self.grid
        grid.setRowCount(len(table.profiles))
        grid.setColumnCount(len(table.contexts))
        grid.setHorizontalHeaderLabels([f"{context_label(c)} context" for c in table.contexts])
        for row, profile in enumerate(table.profiles):
            header = QTableWidgetItem(profile_label(profile.name, capital=True))
            header.setToolTip(f"{profile.description}\n{profile.budget_description()}")
            grid.setVerticalHeaderItem(row, header)
            for column, context in enumerate(table.contexts):
                cell = table.cell(profile.name, context)
                text = cell.label() + (f"\n{cell.speed_text()}" if cell.speed_text() else "")
                item = QTableWidgetItem(text)
                background = status_color(cell.status)
                item.setBackground(background)
                item.setForeground(text_color_on(background))
                item.setToolTip(cell_tooltip(cell))
                item.setData(CELL_ROLE, cell)
                grid.setItem(row, column, item)
        grid.resizeRowsToContents()

    # --- applying -----------------------------------------------------------------------

    def cell_at(self, row: int, column: int) -> FitCell | None:
        item = self.grid.item(row, column)
        return None if item is None else item.data(CELL_ROLE)

    def apply_cell(self, row: int, column: int) -> bool:
        """Use the profile and plan of a cell as one undo step; return whether it applied
        (a cell that does not fit, or a table of a model no longer open, is refused)."""
        cell, window = self.cell_at(row, column), self.window_
        if cell is None or self.table is None:
            return False
        if not cell.fits:
            window.statusBar().showMessage(f"{cell.profile}: {cell.problem}", 8000)
            return False
        if window.session.opened is not self._opened:
            window.statusBar().showMessage("The model changed: reopen What fits where", 8000)
            return False
        apply_fit_cell(window, self.table.profile(cell.profile), cell)
        return True

    def _on_grid_double_clicked(self, row: int, column: int) -> None:
        self.apply_cell(row, column)

    def _on_apply_clicked(self) -> None:
        item = self.grid.currentItem()
        if item is not None:
            self.apply_cell(item.row(), item.column())

    def _on_grid_selection_changed(self) -> None:
        item = self.grid.currentItem()
        cell = None if item is None else item.data(CELL_ROLE)
        self.apply_button.setEnabled(cell is not None and cell.fits)


def profile_label(name: str, *, capital: bool = False) -> str:
    """A profile's name in the table's words: "this machine" for the detected one."""
    if name != DETECTED_NAME:
        return name
    return "This machine" if capital else "this machine"


def apply_fit_cell(window: Any, profile: Any, cell: FitCell) -> None:
    """Switch ``window`` to ``profile`` and the cell's map as one undo macro.

    The budgets are the profile's; the session's reserve is the execution device's share (as
    the planner panel's Apply keeps it), the first GPU of the budgets, else the CPU.
    """
    session, stack = window.session, window.undo_stack
    budgets = profile.budgets()
    gpus = sorted(device for device in budgets if isinstance(device, int))
    reserve = cell.reserve.get(gpus[0] if gpus else "cpu", 0)
    name = profile_label(profile.name)
    stack.beginMacro(f"Use {name} at {context_label(cell.context)} (what fits where)")
    try:
        stack.push(SetProfileCommand(session, profile))
        stack.push(SetBudgetsCommand(session, budgets, "Set budgets", reserve=reserve))
        stack.push(
            SetDeviceMapCommand(
                session, cell.device_map, f"Set map for {context_label(cell.context)} context"
            )
        )
    finally:
        stack.endMacro()
    window.statusBar().showMessage(
        f"Using {name} at {context_label(cell.context)} context: {cell.label()}", 8000
    )


def show_fit_table(window: Any) -> FitDialog | None:
    """Open the table for the window's model (``None``, with a status message, without one)."""
    if window.session.opened is None:
        window.statusBar().showMessage("Open a model first (File > Open)", 5000)
        return None
    dialog = FitDialog(window)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.show()
    dialog.start()
    return dialog
