"""``ModuleTreeModel``: a ``QAbstractItemModel`` over the session's ``ModuleTree``.

The session owns the nodes, so ``internalPointer`` is the ``ModuleNode`` itself and nothing is
created per row: ``rowCount`` is ``len(node.children)``, ``index`` is ``node.children[row]``,
``parent`` is ``node.parent`` with its stored ``row``. That keeps a 98k-module MoE as smooth as
a 20-module demo (the view only asks for visible rows).

Rows carry their full module name under ``NAME_ROLE`` (used for filtering and drag and drop) and
a numeric ``SORT_ROLE`` so sorting by parameters or size is numeric and sorting by name keeps
model order (``layers.2`` before ``layers.10``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from PySide6.QtCore import (
    QAbstractItemModel,
    QMimeData,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
    Signal,
)

from workbench.gui.colors import OVER_BUDGET_HEX, device_color, mixed_color
from workbench.gui.precision_column import PRECISION_HEADER, precision_text
from workbench.models.gguf_header import GGUFHeader
from workbench.models.tree import ModuleNode, ModuleTree
from workbench.runtime import BadInputError, device_label, parse_json
from workbench.runtime.formatting import format_nbytes, format_param_count
from workbench.runtime.map_edits import MIXED, MapIndex

MODULES_MIME = "application/x-workbench-modules"
NAME_ROLE = Qt.ItemDataRole.UserRole + 1
SORT_ROLE = Qt.ItemDataRole.UserRole + 2
DEVICE_ROLE = Qt.ItemDataRole.UserRole + 3  # the device value (int | str | MIXED | None)

COLUMNS = ("Name", "Class", "Parameters", "Size", "Stored", "Device", PRECISION_HEADER, "Flags")
(
    NAME_COLUMN,
    CLASS_COLUMN,
    PARAMS_COLUMN,
    SIZE_COLUMN,
    STORED_COLUMN,
    DEVICE_COLUMN,
    PRECISION_COLUMN,
    FLAGS_COLUMN,
) = range(len(COLUMNS))
GGUF_STORED_HEADER = "Stored (GGUF)"
_NUMBER_COLUMNS = (PARAMS_COLUMN, SIZE_COLUMN, STORED_COLUMN)

AnyIndex = QModelIndex | QPersistentModelIndex


def modules_mime_data(names: list[str]) -> QMimeData:
    """Return the ``QMimeData`` a drag of these module names carries (also used by tests)."""
    mime = QMimeData()
    mime.setData(MODULES_MIME, json.dumps(names).encode("utf-8"))
    mime.setText("\n".join(names))
    return mime


def names_from_mime(mime: QMimeData) -> list[str]:
    """Return the module names a drag carries, or ``[]`` when it carries none."""
    if not mime.hasFormat(MODULES_MIME):
        return []
    try:  # a drag from another process may carry anything: deep, huge, not UTF-8
        names = parse_json(
            bytes(mime.data(MODULES_MIME).data()), source="drag data", what="names", fix=""
        )
    except BadInputError:
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


class ModuleTreeModel(QAbstractItemModel):
    """The module tree with sizes and the current device of every row.

    Args:
        parent: Qt parent.

    Example:
        >>> model = ModuleTreeModel()  # doctest: +SKIP
        >>> model.set_tree(opened.tree, {"": "cpu"})
    """

    map_changed = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._tree: ModuleTree | None = None
        self._map_index: MapIndex | None = None
        self._trace: dict[str, str] = {}
        self._trace_map: dict[str, Any] | None = None
        self._trace_shown = False
        self._gguf: GGUFHeader | None = None
        self._precision_map: dict[str, str] = {}  # the session's (the Precision column)
        self._planned_nbytes: dict[str, int] = {}  # module bytes at those precisions

    # --- document ---------------------------------------------------------------------------

    @property
    def tree(self) -> ModuleTree | None:
        """The tree shown, or ``None`` before a model is open."""
        return self._tree

    @property
    def map_index(self) -> MapIndex | None:
        """Lookups over the current map."""
        return self._map_index

    @property
    def gguf(self) -> GGUFHeader | None:
        """The header of the GGUF file the tree was opened from, or ``None``."""
        return self._gguf

    def set_tree(
        self,
        tree: ModuleTree | None,
        device_map: dict[str, Any] | None = None,
        *,
        gguf: GGUFHeader | None = None,
    ) -> None:
        """Show ``tree`` (resets the model) with ``device_map``.

        Args:
            tree: the module tree, or ``None`` for no model.
            device_map: the current map.
            gguf: the header of the GGUF file the tree was opened from: the Stored column is
                then "Stored (GGUF)", each module's bytes in the file as quantized.
        """
        self.beginResetModel()
        self._tree = tree
        self._gguf = gguf if tree is not None else None
        self._trace, self._trace_map, self._trace_shown = {}, None, False
        self._map_index = MapIndex(tree, device_map or {}) if tree is not None else None
        self.endResetModel()

    def set_device_map(self, device_map: dict[str, Any] | None) -> None:
        """Update the device column after a map change (no reset: selection and expansion stay)."""
        if self._tree is None:
            return
        self._map_index = MapIndex(self._tree, device_map or {})
        self._trace_shown = self._trace_map == self._map_index.device_map
        rows = len(self._tree.root.children)
        if rows:
            self.dataChanged.emit(
                self.index(0, DEVICE_COLUMN), self.index(rows - 1, DEVICE_COLUMN), [DEVICE_ROLE]
            )
        self.map_changed.emit()

    def set_precision_map(
        self, precision_map: dict[str, str], planned_nbytes: Mapping[str, int] | None = None
    ) -> None:
        """Update the Precision column, and the Size column to ``planned_nbytes`` (each
        module's bytes at its precision; ``None``: the tree's own) without a reset: selection
        and expansion stay."""
        self._precision_map = dict(precision_map)
        self._planned_nbytes = dict(planned_nbytes or {})
        rows = len(self._tree.root.children) if self._tree is not None else 0
        if rows:
            first, last = sorted((SIZE_COLUMN, PRECISION_COLUMN))
            self.dataChanged.emit(self.index(0, first), self.index(rows - 1, last))

    def _nbytes(self, node: ModuleNode) -> int:
        """The module's planned bytes: at its precision when the session quantizes it."""
        return self._planned_nbytes.get(node.name, node.nbytes)

    def set_trace(self, reasons: dict[str, str], device_map: dict[str, Any]) -> None:
        """Remember the planner's reason per module for the map it planned; the row tooltips
        show them while the current map is that map (not after an undo or another edit)."""
        self._trace = dict(reasons)
        self._trace_map = MapIndex(self._tree, device_map).device_map if self._tree else None
        self._trace_shown = (
            self._map_index is not None and self._trace_map == self._map_index.device_map
        )

    def node(self, index: AnyIndex) -> ModuleNode | None:
        """Return the node of a valid index (``None`` for the invisible root)."""
        if not index.isValid():
            return None
        return index.internalPointer()  # type: ignore[no-any-return]

    def index_of(self, name: str, column: int = 0) -> QModelIndex:
        """Return the index of a module name (invalid when unknown or the root)."""
        if self._tree is None:
            return QModelIndex()
        node = self._tree.get(name)
        if node is None or node.parent is None:
            return QModelIndex()
        return self.createIndex(node.row, column, node)

    # --- structure --------------------------------------------------------------------------

    def _parent_node(self, parent: AnyIndex) -> ModuleNode | None:
        if parent.isValid():
            return parent.internalPointer()  # type: ignore[no-any-return]
        return self._tree.root if self._tree is not None else None

    def index(self, row: int, column: int, parent: AnyIndex = QModelIndex()) -> QModelIndex:  # noqa: B008
        node = self._parent_node(parent)
        if node is None or not (0 <= row < len(node.children)) or not (0 <= column < len(COLUMNS)):
            return QModelIndex()
        return self.createIndex(row, column, node.children[row])

    def parent(self, child: AnyIndex = QModelIndex()) -> QModelIndex:  # type: ignore[override]  # noqa: B008
        if not child.isValid():
            return QModelIndex()
        parent = child.internalPointer().parent
        if parent is None or parent.parent is None:
            return QModelIndex()
        return self.createIndex(parent.row, 0, parent)

    def rowCount(self, parent: AnyIndex = QModelIndex()) -> int:  # noqa: B008
        if parent.isValid() and parent.column() != 0:
            return 0
        node = self._parent_node(parent)
        return len(node.children) if node is not None else 0

    def columnCount(self, parent: AnyIndex = QModelIndex()) -> int:  # noqa: B008
        return len(COLUMNS)

    def hasChildren(self, parent: AnyIndex = QModelIndex()) -> bool:  # noqa: B008
        return self.rowCount(parent) > 0

    def headerData(
        self,
        section: int,
        orientation: Qt.Orientation,
        role: int = Qt.ItemDataRole.DisplayRole,
    ) -> Any:
        if orientation != Qt.Orientation.Horizontal or not 0 <= section < len(COLUMNS):
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            if section == STORED_COLUMN and self._gguf is not None:
                return GGUF_STORED_HEADER
            return COLUMNS[section]
        if role == Qt.ItemDataRole.ToolTipRole:
            return self._header_tooltip(section)
        return None

    def _header_tooltip(self, section: int) -> str | None:
        planned = self._tree.planning_dtype if self._tree is not None else None
        if section == SIZE_COLUMN:
            dtype = str(planned).removeprefix("torch.") if planned is not None else "as stored"
            return f"Bytes once loaded ({dtype}): what planning counts"
        if section != STORED_COLUMN:
            return None
        if self._gguf is None:
            return "Bytes in the checkpoint files"
        kinds = ", ".join(f"{count} {kind}" for kind, count in self._gguf.quant_types.items())
        return (
            f"Bytes in the GGUF file as quantized (tensors: {kinds}), from its header; "
            "Convert for loading writes them in the Size column's dtype"
        )

    def flags(self, index: AnyIndex) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return (
            Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsDragEnabled
        )

    # --- data -------------------------------------------------------------------------------

    def data(self, index: AnyIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        node: ModuleNode = index.internalPointer()
        column = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._display(node, column)
        if role == NAME_ROLE:
            return node.name
        if role == SORT_ROLE:
            return self._sort_value(node, column)
        if role == DEVICE_ROLE:
            return self._device(node)
        if role == Qt.ItemDataRole.ToolTipRole:
            return self._tooltip(node)
        if role == Qt.ItemDataRole.DecorationRole and column == DEVICE_COLUMN:
            device = self._device(node)
            if device is None:
                return None
            return mixed_color() if device == MIXED else device_color(device)
        if role == Qt.ItemDataRole.TextAlignmentRole and column in _NUMBER_COLUMNS:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def _device(self, node: ModuleNode) -> int | str | None:
        return self._map_index.device_of(node) if self._map_index is not None else None

    def _display(self, node: ModuleNode, column: int) -> str | None:
        if column == NAME_COLUMN:
            return node.short_name or "(model)"
        if column == CLASS_COLUMN:
            return node.class_name
        if column == PARAMS_COLUMN:
            return format_param_count(node.param_count)
        if column == SIZE_COLUMN:
            return format_nbytes(self._nbytes(node))
        if column == STORED_COLUMN:
            return format_nbytes(node.stored_nbytes)
        if column == DEVICE_COLUMN:
            device = self._device(node)
            if device is None:
                return "—"
            return MIXED if device == MIXED else device_label(device)
        if column == PRECISION_COLUMN:
            return precision_text(node.name, self._precision_map)
        if column == FLAGS_COLUMN:
            flags = []
            if node.no_split:
                flags.append("no-split")
            if node.tied:
                flags.append("tied")
            return " ".join(flags)
        return None

    def _sort_value(self, node: ModuleNode, column: int) -> Any:
        if column == PARAMS_COLUMN:
            return node.param_count
        if column == SIZE_COLUMN:
            return self._nbytes(node)
        if column == STORED_COLUMN:
            return node.stored_nbytes
        if column == CLASS_COLUMN:
            return node.class_name
        if column in (DEVICE_COLUMN, PRECISION_COLUMN):
            return self._display(node, column)
        if column == FLAGS_COLUMN:
            return int(node.no_split) * 2 + int(node.tied)
        return node.row  # name: model order

    def _bytes_line(self, node: ModuleNode) -> str:
        """``"20.3 MiB planned, 6.0 MiB stored"``; for a GGUF, with its bits per weight."""
        planned = self._nbytes(node)
        line = f"{format_nbytes(planned)} planned, {format_nbytes(node.stored_nbytes)} stored"
        if planned != node.nbytes:
            line += f" ({format_nbytes(node.nbytes)} before quantization)"
        if self._gguf is None:
            return line
        # bits per weight from the file's own bytes: Q4_1 is 5.0 (20 B per 32), Q8_0 8.5
        bits = node.stored_nbytes * 8 / node.param_count if node.param_count else 0.0
        return f"{line} in the GGUF ({bits:.2f} bits per weight)"

    def _tooltip(self, node: ModuleNode) -> str:
        lines = [
            f"<b>{node.name or '(whole model)'}</b> — {node.class_name}",
            f"{node.param_count:,} parameters",
            self._bytes_line(node),
        ]
        device = self._device(node)
        if device == MIXED:
            lines.append("split over several devices (see its children)")
        elif device is not None:
            lines.append(f"on {device_label(device)}")
        else:
            lines.append(f"<span style='color:{OVER_BUDGET_HEX}'>not covered by the map</span>")
        if node.no_split:
            lines.append("no-split: stays whole on one device")
        if node.tied and self._tree is not None:
            partners = sorted(
                {
                    name
                    for group in self._tree.tied_groups
                    if any(self._tree.tensor_owner[t] == node.name for t in group)
                    for name in group
                }
            )
            lines.append(f"tied: {', '.join(partners)} move together")
            lines.extend(self._counted_elsewhere(node))
        reason, current = None, node if self._trace_shown else None
        while reason is None and current is not None:  # a placed parent explains its children
            reason, current = self._trace.get(current.name), current.parent
        if reason:
            lines.append(f"<i>planner:</i> {reason}")
        return "<br>".join(lines)

    def _counted_elsewhere(self, node: ModuleNode) -> list[str]:
        """A line per tensor of ``node`` that is another module's (tied), whose parameters
        and bytes the tree counts once, at that module: why a tied output layer reads 0."""
        tree = self._tree
        if tree is None:
            return []
        lines = []
        for group in tree.tied_groups:
            counted = [name for name in group if name in tree.tensor_nbytes]
            for name in group:
                if name in counted or tree.tensor_owner.get(name) != node.name or not counted:
                    continue
                owner = tree.tensor_owner.get(counted[0], "")
                lines.append(
                    f"{name} is {counted[0]}: counted once, in {owner or '(whole model)'}"
                    f" ({format_nbytes(tree.tensor_nbytes[counted[0]])})"
                )
        return lines

    # --- drag -------------------------------------------------------------------------------

    def supportedDragActions(self) -> Qt.DropAction:
        return Qt.DropAction.MoveAction

    def mimeTypes(self) -> list[str]:
        return [MODULES_MIME]

    def mimeData(self, indexes: list[QModelIndex]) -> QMimeData:  # type: ignore[override]
        names = list(
            dict.fromkeys(self.node(i).name for i in indexes if i.isValid())  # type: ignore[union-attr]
        )
        return modules_mime_data(names)
