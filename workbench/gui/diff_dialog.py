"""Diff two device maps: modules that changed device, bytes per device, predicted speed.

The other map comes from a file or from an earlier state of the undo history (the row
selected in the History dock; the opened state by default).

Example:
    >>> diff = diff_maps(tree, before_map, after_map)  # doctest: +SKIP
    >>> diff.moved[:1]
    [('model.layers.30', 0, 'cpu')]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QUndoCommand, QUndoStack
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from workbench.big_modeling.devices import device_label, device_sort_key
from workbench.big_modeling.errors import BadInputError
from workbench.gui.commands import SetDeviceMapCommand
from workbench.gui.formatting import format_nbytes, format_rate, format_seconds
from workbench.gui.map_edit import MIXED, MapIndex

if TYPE_CHECKING:
    from workbench.gui.main_window import MainWindow
    from workbench.models.tree import ModuleTree


@dataclass(frozen=True)
class MapDiff:
    """What differs between two maps over one tree.

    Attributes:
        moved: ``(name, device before, device after)`` for every map key whose device changed
            (``None`` = uncovered), in model order.
        bytes_before: planning bytes per device under the first map.
        bytes_after: the same under the second.
    """

    moved: list[tuple[str, Any, Any]]
    bytes_before: dict[Any, int]
    bytes_after: dict[Any, int]


def _resolve(index: MapIndex, name: str) -> Any:
    node = index.tree.get(name)
    if node is not None:
        return index.device_of(node)
    if name in index.device_map:
        return index.device_map[name]
    owner = index.tree.get(index.tree.tensor_owner.get(name, ""))
    return index.device_of(owner) if owner is not None else None


def diff_maps(tree: ModuleTree, before: dict[str, Any], after: dict[str, Any]) -> MapDiff:
    """Compare ``before`` and ``after`` key by key (both maps' keys), resolving prefixes."""
    first, second = MapIndex(tree, before), MapIndex(tree, after)
    names = sorted(set(first.device_map) | set(second.device_map), key=first.order_key)
    moved = []
    for name in names:
        old, new = _resolve(first, name), _resolve(second, name)
        if old != new and MIXED not in (old, new):
            moved.append((name, old, new))
    return MapDiff(moved, first.per_device_bytes(), second.per_device_bytes())


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
    """Non-modal dialog showing a ``MapDiff`` and the predicted speed before/after."""

    def __init__(self, window: MainWindow, other: dict[str, Any], other_label: str) -> None:
        super().__init__(window)
        self.setWindowTitle(f"Diff: {other_label} → current map")
        self.setModal(False)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        tree = window.session.tree
        assert tree is not None  # callers check that a model is open
        current = dict(window.session.device_map)
        self.diff = diff_maps(tree, other, current)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel(f"<b>{len(self.diff.moved)}</b> module(s) changed device", self))
        moved = QTableWidget(len(self.diff.moved), 3, self)
        moved.setHorizontalHeaderLabels(["Module", other_label, "current"])
        for row, (name, old, new) in enumerate(self.diff.moved):
            for column, text in enumerate((name, _label(old), _label(new))):
                moved.setItem(row, column, QTableWidgetItem(text))
        moved.resizeColumnsToContents()
        layout.addWidget(moved, 2)
        devices = sorted(
            set(self.diff.bytes_before) | set(self.diff.bytes_after), key=device_sort_key
        )
        totals = QTableWidget(len(devices), 2, self)
        totals.setHorizontalHeaderLabels([other_label, "current"])
        totals.setVerticalHeaderLabels([device_label(d) for d in devices])
        for row, device in enumerate(devices):
            totals.setItem(
                row, 0, QTableWidgetItem(format_nbytes(self.diff.bytes_before.get(device, 0)))
            )
            totals.setItem(
                row, 1, QTableWidgetItem(format_nbytes(self.diff.bytes_after.get(device, 0)))
            )
        layout.addWidget(totals, 1)
        self.speed_label = QLabel(self._speed_text(window, other, current), self)
        layout.addWidget(self.speed_label)
        self.resize(640, 480)

    @staticmethod
    def _speed_text(window: MainWindow, before: dict[str, Any], after: dict[str, Any]) -> str:
        profile = window.hardware_profile()
        if profile is None:
            return "Predicted speed: no hardware profile"
        from workbench.models.speed import predict_speed

        parts = []
        for label, device_map in (("before", before), ("after", after)):
            try:
                prediction = predict_speed(window.session.tree, device_map, profile)
            except ValueError as exc:
                parts.append(f"{label}: n/a ({exc})")
                continue
            parts.append(
                f"{label}: {format_rate(prediction.tokens_per_s)}, TTFT {format_seconds(prediction.ttft_s)}"
            )
        return "Predicted speed — " + "; ".join(parts)


def _label(device: Any) -> str:
    return "uncovered" if device is None else device_label(device)


def show_diff(window: MainWindow, other: dict[str, Any], other_label: str) -> DiffDialog | None:
    """Open the diff dialog (non-modal); ``None`` when no model is open."""
    if window.session.tree is None:
        window.statusBar().showMessage("Open a model first", 3000)
        return None
    dialog = DiffDialog(window, other, other_label)
    dialog.show()
    return dialog


def show_diff_against_file(window: MainWindow, path: str | None = None) -> DiffDialog | None:
    """Diff the current map against a map file (asks for it when ``path`` is ``None``)."""
    if path is None:
        path, _ = QFileDialog.getOpenFileName(
            window, "Diff against map file", "", "Device map (*.json)"
        )
        if not path:
            return None
    from workbench.gui.map_io import read_map_file

    try:
        other = read_map_file(path)
    except (BadInputError, OSError) as exc:
        window._show_error("Cannot read device map", str(exc))
        return None
    return show_diff(window, other, path.rsplit("/", 1)[-1])


def show_diff_against_history(window: MainWindow, index: int | None = None) -> DiffDialog | None:
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
