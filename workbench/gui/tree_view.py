"""The module tree panel: filter box (name or regex), expand-to-depth, and the tree view.

``ModuleTreeView`` drags the selected rows (``MODULES_MIME``) onto the device lanes; device
cells are drawn as coloured chips by ``DeviceChipDelegate``. Sorting and filtering go through a
``QSortFilterProxyModel`` with recursive filtering, so a match deep in the tree keeps its
ancestors visible; the panel then expands those ancestors (up to ``MAX_EXPANDED_MATCHES``
matches) and shows the match count.
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
    QLabel,
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
    STORED_COLUMN,
    ModuleTreeModel,
)
from workbench.models.tree import ModuleNode, ModuleTree

MAX_EXPANDED_MATCHES = 2000  # more rows than anyone scrolls through; keeps typing responsive
FILTER_PLACEHOLDER = "Filter modules (Ctrl+F)"
FILTER_TIP = "Show the modules whose full name contains this text (a pattern with Regex)"


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


def matching_nodes(tree: ModuleTree, text: str, *, regex: bool) -> list[ModuleNode]:
    """Return the nodes whose full name matches the filter ``text``, in model (pre-)order.

    Matches what ``ModuleFilterProxy.set_pattern`` shows: case-insensitive search anywhere in
    the name. A pattern Python's ``re`` rejects but Qt accepts is matched with Qt's engine.
    """
    pattern = text if regex else re.escape(text)
    nodes = [node for node in tree.iter_nodes() if node.parent is not None]
    try:
        search = re.compile(pattern, re.IGNORECASE).search
    except re.error:
        expression = QRegularExpression(
            pattern, QRegularExpression.PatternOption.CaseInsensitiveOption
        )
        return [node for node in nodes if expression.match(node.name).hasMatch()]
    return [node for node in nodes if search(node.name)]


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
        self.filter_edit.setPlaceholderText(FILTER_PLACEHOLDER)
        self.filter_edit.setToolTip(FILTER_TIP)
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.setAccessibleName("Filter modules")
        placeholder_px = self.filter_edit.fontMetrics().horizontalAdvance(FILTER_PLACEHOLDER)
        self.filter_edit.setMinimumWidth(placeholder_px + 48)  # frame, margins, clear button
        self.match_label = QLabel(self)
        self.match_label.setObjectName("filterMatches")
        self.match_label.setAccessibleName("Filter matches")
        self.matches: list[ModuleNode] = []
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
        filter_row = QHBoxLayout()
        filter_row.addWidget(self.filter_edit, 1)
        filter_row.addWidget(self.regex_check)
        tools_row = QHBoxLayout()
        tools_row.addWidget(self.match_label, 1)
        tools_row.addWidget(self.depth_spin)
        tools_row.addWidget(self.expand_button)
        tools_row.addWidget(self.collapse_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(3)
        layout.addLayout(filter_row)
        layout.addLayout(tools_row)
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
        self.view.header().setSectionHidden(STORED_COLUMN, model.gguf is None)

    def apply_filter(self) -> None:
        """Apply the filter box now (normally debounced by 200 ms).

        Expands the ancestors of the matches (of the first ``MAX_EXPANDED_MATCHES`` when there
        are more) so every match shown is in view, and shows the match count.
        """
        self._filter_timer.stop()
        text = self.filter_edit.text().strip()
        regex = self.regex_check.isChecked()
        error = self.proxy.set_pattern(text, regex=regex)
        self.filter_edit.setToolTip(error or FILTER_TIP)
        if error:
            self.filter_error.emit(error)
            return
        tree = self.model.tree
        self.matches = matching_nodes(tree, text, regex=regex) if text and tree else []
        self._show_match_count(text)
        if self.matches:
            self._expand_to(self.matches[:MAX_EXPANDED_MATCHES])

    def _show_match_count(self, text: str) -> None:
        count = len(self.matches)
        if not text or self.model.tree is None:
            message, tip = "", ""
        elif count == 0:
            message, tip = "no matches", f"no module name matches {text!r}"
        elif count > MAX_EXPANDED_MATCHES:
            message = f"{count:,} matches (first {MAX_EXPANDED_MATCHES:,} expanded)"
            tip = (
                f"{count:,} modules match; the tree opens to the first {MAX_EXPANDED_MATCHES:,}. "
                "Narrow the filter, or expand the rest by hand."
            )
        else:
            message = f"{count:,} match" + ("" if count == 1 else "es")
            tip = "Enter selects the first match"
        self.match_label.setText(message)
        self.match_label.setToolTip(tip)

    def _expand_to(self, matches: list[ModuleNode]) -> None:
        ancestors: dict[str, None] = {}  # ordered set, parents first per match
        for node in matches:
            chain = []
            parent = node.parent
            while parent is not None and parent.parent is not None and parent.name not in ancestors:
                chain.append(parent.name)
                parent = parent.parent
            ancestors.update(dict.fromkeys(reversed(chain)))
        view = self.view
        view.collapseAll()
        view.scheduleDelayedItemsLayout()  # one layout at the end, not one per expand
        for name in ancestors:
            index = self.proxy.mapFromSource(self.model.index_of(name))
            if index.isValid():
                view.expand(index)

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
        self.matches = []
        self.match_label.clear()
        header = self.view.header()
        class_px, device_px = self._class_column_width(), self._device_column_width()
        stored_px = 0 if self.model.gguf is None else 100
        header.resizeSection(CLASS_COLUMN, class_px)
        header.resizeSection(PARAMS_COLUMN, 70)
        header.resizeSection(SIZE_COLUMN, 75)
        header.setSectionHidden(STORED_COLUMN, self.model.gguf is None)  # GGUF bytes only
        header.resizeSection(STORED_COLUMN, 100)
        header.resizeSection(DEVICE_COLUMN, device_px)
        # the name takes what the others leave (down to 140 px), so the device chips and
        # the flags fit the panel without scrolling sideways
        rest = self.view.viewport().width() - class_px - 145 - stored_px - device_px - 60
        header.resizeSection(NAME_COLUMN, max(140, min(190, rest)))

    def _device_column_width(self) -> int:
        """Wide enough for the header and a "cuda:0" chip (the delegate pads by 20 px)."""
        metrics = self.view.fontMetrics()
        chip_px = metrics.horizontalAdvance("cuda:0") + 24
        return max(chip_px, metrics.horizontalAdvance("Device") + 20)

    def _class_column_width(self) -> int:
        """Wide enough for the longest class name (``LlamaDecoderLayer``), within 120..260 px."""
        tree = self.model.tree
        if tree is None:
            return 120
        classes = {node.class_name for node in tree.iter_nodes()}
        widest = max((self.view.fontMetrics().horizontalAdvance(c) for c in classes), default=0)
        return max(120, min(widest + 16, 260))
