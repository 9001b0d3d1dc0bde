"""The module tree panel: filter box (name or regex), expand-to-depth, and the tree view.

``ModuleTreeView`` drags the selected rows (``MODULES_MIME``) onto the device lanes; device
cells are drawn as coloured chips by ``DeviceChipDelegate``. Sorting and filtering go through a
``QSortFilterProxyModel`` with recursive filtering, so a match deep in the tree keeps its
ancestors visible.
"""

from __future__ import annotations

import re

from PySide6.QtCore import (
    QModelIndex,
    QPersistentModelIndex,
    QRectF,
    QRegularExpression,
    QSortFilterProxyModel,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QSpinBox,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QToolButton,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from workbench.gui.colors import text_color_on
from workbench.gui.tree_model import (
    CLASS_COLUMN,
    DEVICE_COLUMN,
    NAME_COLUMN,
    NAME_ROLE,
    PARAMS_COLUMN,
    SIZE_COLUMN,
    SORT_ROLE,
    ModuleTreeModel,
)


class DeviceChipDelegate(QStyledItemDelegate):
    """Paints the device cell as a rounded chip in the device's colour."""

    def paint(
        self,
        painter: QPainter,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        color = index.data(Qt.ItemDataRole.DecorationRole)
        text = index.data(Qt.ItemDataRole.DisplayRole) or ""
        if not isinstance(color, QColor):
            super().paint(painter, option, index)
            return
        style = option.widget.style() if option.widget is not None else None
        if style is not None:  # selection/hover background first
            style.drawPrimitive(
                QStyle.PrimitiveElement.PE_PanelItemViewItem, option, painter, option.widget
            )
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        metrics = option.fontMetrics
        width = min(option.rect.width() - 6, metrics.horizontalAdvance(text) + 14)
        chip = QRectF(
            option.rect.left() + 3, option.rect.top() + 2, width, option.rect.height() - 4
        )
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(color)
        painter.drawRoundedRect(chip, chip.height() / 2, chip.height() / 2)
        painter.setPen(text_color_on(color))
        painter.drawText(chip, Qt.AlignmentFlag.AlignCenter, text)
        painter.restore()


class ModuleFilterProxy(QSortFilterProxyModel):
    """Recursive name/regex filter over full module names; numeric sort through ``SORT_ROLE``."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setRecursiveFilteringEnabled(True)
        self.setFilterRole(NAME_ROLE)
        self.setFilterKeyColumn(NAME_COLUMN)
        self.setSortRole(SORT_ROLE)
        self.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.setDynamicSortFilter(False)  # the map changes often; the structure never does

    def set_pattern(self, text: str, *, regex: bool) -> str | None:
        """Filter by ``text`` (substring, or a regular expression); return an error or ``None``."""
        pattern = text if regex else re.escape(text)
        expression = QRegularExpression(
            pattern, QRegularExpression.PatternOption.CaseInsensitiveOption
        )
        if not expression.isValid():
            return f"invalid regular expression: {expression.errorString()}"
        self.setFilterRegularExpression(expression)
        return None


class ModuleTreeView(QTreeView):
    """The tree: extended selection, drag source, uniform rows (fast with 100k modules)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("moduleTree")
        self.setUniformRowHeights(True)
        self.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setDragEnabled(True)
        self.setDragDropMode(QAbstractItemView.DragDropMode.DragOnly)
        self.setDefaultDropAction(Qt.DropAction.MoveAction)
        self.setAlternatingRowColors(True)
        self.setSortingEnabled(True)
        self.sortByColumn(-1, Qt.SortOrder.AscendingOrder)  # model order until a header click
        self.setItemDelegateForColumn(DEVICE_COLUMN, DeviceChipDelegate(self))
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.setAccessibleName("Module tree")
        header = self.header()
        header.setStretchLastSection(True)
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setDefaultSectionSize(90)

    def selected_names(self) -> list[str]:
        """Return the full names of the selected rows, in selection order, deduplicated."""
        names = [
            index.data(NAME_ROLE)
            for index in self.selectionModel().selectedRows(NAME_COLUMN)
            if index.data(NAME_ROLE) is not None
        ]
        return list(dict.fromkeys(names))


class ModuleTreePanel(QWidget):
    """Filter box, regex toggle, expand-to-depth and the view over ``ModuleTreeModel``."""

    filter_error = Signal(str)

    def __init__(self, model: ModuleTreeModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.proxy = ModuleFilterProxy(self)
        self.proxy.setSourceModel(model)
        self.view = ModuleTreeView(self)
        self.view.setModel(self.proxy)
        self.filter_edit = QLineEdit(self)
        self.filter_edit.setPlaceholderText("Filter modules by name (Ctrl+F)")
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.setAccessibleName("Filter modules")
        self.regex_check = QCheckBox("Regex", self)
        self.depth_spin = QSpinBox(self)
        self.depth_spin.setRange(1, 12)
        self.depth_spin.setValue(2)
        self.depth_spin.setPrefix("depth ")
        self.depth_spin.setAccessibleName("Expand depth")
        self.expand_button = QToolButton(self)
        self.expand_button.setText("Expand")
        self.expand_button.setToolTip("Expand the tree to the chosen depth")
        self.collapse_button = QToolButton(self)
        self.collapse_button.setText("Collapse")
        row = QHBoxLayout()
        row.addWidget(self.filter_edit, 1)
        row.addWidget(self.regex_check)
        row.addWidget(self.depth_spin)
        row.addWidget(self.expand_button)
        row.addWidget(self.collapse_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.view)
        self._filter_timer = QTimer(self)
        self._filter_timer.setSingleShot(True)
        self._filter_timer.setInterval(200)
        self._filter_timer.timeout.connect(self.apply_filter)
        self.filter_edit.textChanged.connect(self._filter_timer.start)
        self.regex_check.toggled.connect(self._filter_timer.start)
        self.filter_edit.returnPressed.connect(self._on_filter_return_pressed)
        self.expand_button.clicked.connect(self._on_expand_button_clicked)
        self.collapse_button.clicked.connect(self.view.collapseAll)
        model.map_changed.connect(self.view.viewport().update)
        model.modelReset.connect(self._on_model_reset)

    def apply_filter(self) -> None:
        """Apply the filter box now (normally debounced by 200 ms)."""
        self._filter_timer.stop()
        text = self.filter_edit.text().strip()
        error = self.proxy.set_pattern(text, regex=self.regex_check.isChecked())
        self.filter_edit.setToolTip(error or "")
        if error:
            self.filter_error.emit(error)
            return
        if text:
            self.view.expandToDepth(1)

    def select_names(self, names: list[str]) -> None:
        """Select the rows of ``names`` (visible through the current filter) and show the first."""
        selection = self.view.selectionModel()
        selection.clearSelection()
        first = None
        for name in names:
            source = self.model.index_of(name)
            index = self.proxy.mapFromSource(source)
            if not index.isValid():
                continue
            selection.select(
                index,
                selection.SelectionFlag.Select | selection.SelectionFlag.Rows,
            )
            first = first or index
        if first is not None:
            self.view.scrollTo(first)
            self.view.setCurrentIndex(first)

    def _on_filter_return_pressed(self) -> None:
        self.apply_filter()
        first = self.proxy.index(0, 0)
        while first.isValid() and not self._matches(first):
            first = self.proxy.index(0, 0, first)
        if first.isValid():
            self.view.setCurrentIndex(first)
            self.view.scrollTo(first)

    def _matches(self, index: QModelIndex) -> bool:
        name = index.data(NAME_ROLE) or ""
        return bool(self.proxy.filterRegularExpression().match(name).hasMatch())

    def _on_expand_button_clicked(self) -> None:
        self.view.expandToDepth(self.depth_spin.value() - 1)

    def _on_model_reset(self) -> None:
        self.view.expandToDepth(0)
        header = self.view.header()
        header.resizeSection(NAME_COLUMN, 190)
        header.resizeSection(CLASS_COLUMN, 120)
        header.resizeSection(PARAMS_COLUMN, 70)
        header.resizeSection(SIZE_COLUMN, 75)
