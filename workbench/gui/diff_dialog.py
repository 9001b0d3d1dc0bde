"""Diff two device maps: modules that changed device, bytes per device, predicted speed.

The other map comes from a file or from an earlier state of the undo history (the row
selected in the History dock; the opened state by default).

The comparison is the runtime's (``workbench.runtime.map_edits.diff_maps``).

Example:
    >>> diff = diff_maps(tree, before_map, after_map)  # doctest: +SKIP
    >>> diff.moved[:1]
    [('model.layers.30', 0, 'cpu')]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QUndoCommand, QUndoStack
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHeaderView,
    QLabel,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from workbench.gui.colors import over_budget_color
from workbench.gui.commands import SetDeviceMapCommand
from workbench.gui.map_io import read_map_file
from workbench.runtime import BadInputError, device_label, device_sort_key
from workbench.runtime.formatting import format_forward, format_nbytes, format_rate, format_seconds
from workbench.runtime.machine_attention import predict_with_attention
from workbench.runtime.map_edits import diff_maps, key_problems
from workbench.runtime.model_kind import generates_tokens

if TYPE_CHECKING:
    from workbench.gui.window_context import WindowContext
    from workbench.models.tree import ModuleTree


def map_at_index(stack: QUndoStack, current_map: dict[str, Any], index: int) -> dict[str, Any]:
    """Return the device map as it was at undo-stack state ``index`` (0 = before any command)."""
    for position in range(index, stack.index()):
        first = _first_map_command(stack.command(position))
        if first is not None:
            return first.before
    return dict(current_map)


def _first_map_command(command: QUndoCommand) -> SetDeviceMapCommand | None:
    if isinstance(command, SetDeviceMapCommand):
        return command
    for child in range(command.childCount()):
        found = _first_map_command(command.child(child))  # type: ignore[arg-type]
        if found is not None:
            return found
    return None


class DiffDialog(QDialog):
    """Window-modal dialog showing a ``MapDiff``, each map's problems and the predicted speed.

    Window-modal, and a new diff closes the one before: diff dialogs never pile up, and none
    stays open while the user loads.

    Unknown keys and uncovered modules of either map are named (the first few, then a count);
    long messages wrap, so the dialog keeps a readable width whatever the maps hold.
    """

    def __init__(self, window: WindowContext, other: dict[str, Any], other_label: str) -> None:
        super().__init__(window)
        self.setWindowTitle(f"Diff: {other_label} → current map")
        self.setWindowModality(Qt.WindowModality.WindowModal)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        tree = window.session.tree
        assert tree is not None  # callers check that a model is open
        current = dict(window.session.device_map)
        self.diff = diff_maps(tree, other, current)
        self.problems = key_problems(tree, other, other_label) + key_problems(
            tree, current, "the current map"
        )
        column_label = _elide(other_label, 32)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel(f"<b>{len(self.diff.moved)}</b> module(s) changed device", self))
        self.problems_label = _wrapped_label("<br>".join(f"⚠ {p}" for p in self.problems), self)
        self.problems_label.setStyleSheet(f"color: {over_budget_color().name()};")
        self.problems_label.setVisible(bool(self.problems))
        layout.addWidget(self.problems_label)
        self.moved_table = self._moved_table(tree, column_label, other_label)
        layout.addWidget(self.moved_table, 2)
        self.totals_table = self._totals_table(column_label, other_label)
        layout.addWidget(self.totals_table)
        speed = self._speed_text(window, other, current)
        self.speed_label = _wrapped_label(_shorten(speed), self)
        self.speed_label.setToolTip(speed if len(speed) > MESSAGE_CHARS else "")
        layout.addWidget(self.speed_label)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        self.buttons.rejected.connect(self.close)
        layout.addWidget(self.buttons)
        self.resize(_initial_size(window))

    def _moved_table(self, tree: ModuleTree, column_label: str, other_label: str) -> QTableWidget:
        table = QTableWidget(len(self.diff.moved), 3, self)
        table.setHorizontalHeaderLabels(["Module", column_label, "current"])
        table.horizontalHeaderItem(1).setToolTip(other_label)
        unknown_color = over_budget_color()
        for row, (name, old, new) in enumerate(self.diff.moved):
            known = name in tree or name in tree.tensor_owner
            cells = (
                name if known else f"{name} (not in the model)",
                _label(old, known),
                _label(new, known),
            )
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if not known:
                    item.setForeground(unknown_color)
                    item.setToolTip(f"{name!r} names no module or tensor of the model")
                table.setItem(row, column, item)
        table.resizeColumnsToContents()
        header = table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        return table

    def _totals_table(self, column_label: str, other_label: str) -> QTableWidget:
        devices = sorted(
            set(self.diff.bytes_before) | set(self.diff.bytes_after), key=device_sort_key
        )
        table = QTableWidget(len(devices), 2, self)
        table.setHorizontalHeaderLabels([column_label, "current"])
        table.horizontalHeaderItem(0).setToolTip(other_label)
        table.setVerticalHeaderLabels([device_label(d) for d in devices])
        for row, device in enumerate(devices):
            for column, totals in enumerate((self.diff.bytes_before, self.diff.bytes_after)):
                item = QTableWidgetItem(format_nbytes(totals.get(device, 0)))
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                table.setItem(row, column, item)
        table.resizeColumnsToContents()  # the header text counts, so it is never clipped
        table.resizeRowsToContents()
        rows_px = table.verticalHeader().length() + table.horizontalHeader().sizeHint().height()
        table.setMaximumHeight(
            rows_px + 2 * table.frameWidth() + 2
        )  # one row per device, no scroll
        return table

    @staticmethod
    def _speed_text(window: WindowContext, before: dict[str, Any], after: dict[str, Any]) -> str:
        profile = window.hardware_profile()
        if profile is None:
            return "Predicted speed: no hardware profile"
        parts = []
        for label, device_map in (("before", before), ("after", after)):
            try:
                prediction = predict_with_attention(
                    window.session.opened, window.session.tree, device_map, profile
                )
            except ValueError as exc:
                parts.append(f"{label}: n/a ({exc})")
                continue
            if generates_tokens(window.session.opened):
                figures = f"{format_rate(prediction.tokens_per_s)}, TTFT {format_seconds(prediction.ttft_s)}"
            else:  # one forward is all its run makes
                figures = format_forward(prediction.prefill_s)
            parts.append(f"{label}: {figures}")
        return "Predicted speed — " + "; ".join(parts)


MESSAGE_CHARS = 300  # past this a message is cut; the full text goes to the tooltip


def _shorten(text: str, limit: int = MESSAGE_CHARS) -> str:
    """Cut ``text`` after ``limit`` characters at a word boundary, marking the cut with "…"."""
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > limit // 2 else limit].rstrip(",;") + " …"


def _elide(text: str, limit: int) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


def _wrapped_label(text: str, parent: QWidget) -> QLabel:
    label = QLabel(text, parent)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    return label


def _initial_size(window: QWidget) -> QSize:
    """720 x 520, or less on a small screen."""
    screen = window.screen()
    if screen is None:
        return QSize(720, 520)
    available = screen.availableGeometry()
    return QSize(min(720, int(available.width() * 0.9)), min(520, int(available.height() * 0.9)))


def _label(device: Any, known: bool = True) -> str:
    if device is None:
        return "uncovered" if known else "—"
    return device_label(device)


def show_diff(window: WindowContext, other: dict[str, Any], other_label: str) -> DiffDialog | None:
    """Open the diff dialog (window-modal, replacing one still open); ``None`` without a model."""
    if window.session.tree is None:
        window.statusBar().showMessage("Open a model first", 3000)
        return None
    for previous in window.findChildren(DiffDialog):
        if previous.isVisible():
            previous.close()
    dialog = DiffDialog(window, other, other_label)
    dialog.open()
    return dialog


def show_diff_against_file(window: WindowContext, path: str | None = None) -> DiffDialog | None:
    """Diff the current map against a map file (asks for it when ``path`` is ``None``)."""
    if path is None:
        path, _ = QFileDialog.getOpenFileName(
            window, "Diff against map file", "", "Device map (*.json)"
        )
        if not path:
            return None
    try:
        other = read_map_file(path)
    except (BadInputError, OSError) as exc:
        window.show_error("Cannot read device map", str(exc))
        return None
    return show_diff(window, other, path.rsplit("/", 1)[-1])


def show_diff_against_history(window: WindowContext, index: int | None = None) -> DiffDialog | None:
    """Diff against undo state ``index`` (default: the History selection, else the opened state)."""
    if index is None:
        selected = window.undo_view.currentIndex()
        index = (
            selected.row()
            if selected.isValid() and selected.row() < window.undo_stack.index()
            else 0
        )
    other = map_at_index(window.undo_stack, dict(window.session.device_map), index)
    label = "opened" if index == 0 else f"step {index}"
    return show_diff(window, other, label)
