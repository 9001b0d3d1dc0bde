"""Device lanes: one per device of the hardware profile, each a capacity bar and its blocks.

A lane accepts module rows dragged from the tree (``MODULES_MIME``); while dragging it says
whether the drop is allowed and why not (no-split module, unknown row). A drop calls the
window's move handler, which pushes one undo command; the lane never edits the session.

Example:
    >>> lanes = LanesWidget(move_handler=lambda names, device: None)  # doctest: +SKIP
    >>> lanes.update_lanes(tree, device_map, budgets, reserve_bytes=0, reserve_device=0)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QMimeData, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QDragEnterEvent, QDragMoveEvent, QDropEvent, QPainter, QPaintEvent
from PySide6.QtWidgets import QFrame, QLabel, QSizePolicy, QVBoxLayout, QWidget

from workbench.gui.colors import device_color, over_budget_color, reserve_color
from workbench.gui.tree_model import names_from_mime
from workbench.models.tree import ModuleTree
from workbench.runtime import device_label, device_sort_key
from workbench.runtime.formatting import format_nbytes
from workbench.runtime.load_check import LoadCheck
from workbench.runtime.map_edits import MapIndex, MoveRefused, compact_names, move_modules

MoveHandler = Callable[[list[str], int | str], str | None]  # returns an error message or None


@dataclass(frozen=True)
class LaneState:
    """What one lane shows.

    Attributes:
        device: canonical device value.
        title: e.g. ``"cuda:0 · NVIDIA H100"``.
        used_bytes: planning bytes placed on the device.
        budget_bytes: the device budget; ``0`` means the device may hold nothing, ``None``
            means no budget is set (never over budget).
        reserve_bytes: bytes kept free for activations and the KV cache on this device.
        reserve_why: the memory model's words for that reserve (``""`` for a fixed one).
        blocks: compacted names of the map entries on the device.
        in_profile: False for a device the map uses but the profile lacks.
    """

    device: int | str
    title: str
    used_bytes: int
    budget_bytes: int | None
    reserve_bytes: int
    blocks: tuple[str, ...]
    in_profile: bool = True
    reserve_why: str = ""

    @property
    def excess_bytes(self) -> int:
        """Bytes over budget (0 when it fits; a device without a budget never overflows)."""
        if self.budget_bytes is None:
            return 0
        return max(0, self.used_bytes + self.reserve_bytes - self.budget_bytes)

    @property
    def over_budget(self) -> bool:
        return self.excess_bytes > 0 or not self.in_profile


def _reserve_on(
    device: int | str,
    reserves: Mapping[int | str, Any] | None,
    reserve_bytes: int,
    reserve_device: int | str | None,
) -> int:
    if reserves is not None:
        reserve = reserves.get(device)
        return int(reserve.nbytes) if reserve is not None else 0
    return reserve_bytes if device == reserve_device else 0


class CapacityBar(QWidget):
    """Used / budget with the reserved share drawn separately; red with the excess when over."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._state: LaneState | None = None
        self.measured_note = ""  # the worker's measured figures for this device, if current
        self.setMinimumHeight(18)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(240, 18)

    def set_state(self, state: LaneState) -> None:
        self._state = state
        self.setToolTip("\n".join(filter(None, (_bar_tooltip(state), self.measured_note))))
        self.update()

    def paintEvent(self, event: QPaintEvent) -> None:
        state = self._state
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        base = self.palette().base().color()
        painter.setPen(self.palette().mid().color())
        painter.setBrush(base)
        painter.drawRoundedRect(rect, 4, 4)
        if state is None:
            return
        total = max(state.budget_bytes or 0, state.used_bytes + state.reserve_bytes, 1)
        inner = rect.adjusted(1, 1, -1, -1)
        used_w = inner.width() * min(state.used_bytes, total) / total
        fill = over_budget_color() if state.over_budget else device_color(state.device)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(fill)
        painter.drawRoundedRect(QRectF(inner.left(), inner.top(), used_w, inner.height()), 3, 3)
        if state.reserve_bytes:
            reserve_w = inner.width() * state.reserve_bytes / total
            reserve = reserve_color()
            painter.setBrush(QColor(reserve.red(), reserve.green(), reserve.blue(), 170))
            painter.drawRect(QRectF(inner.left() + used_w, inner.top(), reserve_w, inner.height()))
        if state.budget_bytes is not None and state.excess_bytes:
            limit_x = inner.left() + inner.width() * state.budget_bytes / total
            painter.setPen(self.palette().text().color())
            painter.drawLine(int(limit_x), int(inner.top()), int(limit_x), int(inner.bottom()))


def _bar_tooltip(state: LaneState) -> str:
    lines = [f"{format_nbytes(state.used_bytes)} placed on {device_label(state.device)}"]
    if state.reserve_bytes:
        lines.append(f"{format_nbytes(state.reserve_bytes)} reserved for activations / KV cache")
        if state.reserve_why:
            lines.append(state.reserve_why)
    if state.budget_bytes is not None:
        lines.append(f"budget {format_nbytes(state.budget_bytes)}")
    if state.excess_bytes:
        lines.append(f"over budget by {format_nbytes(state.excess_bytes)}")
    if not state.in_profile:
        lines.append("this device is not in the hardware profile")
    return "\n".join(lines)


class DeviceLaneWidget(QFrame):
    """One device: title, used/budget figures, capacity bar, blocks; a drop target."""

    drag_hint = Signal(str)

    def __init__(self, device: int | str, lanes: LanesWidget) -> None:
        super().__init__(lanes)
        self.device = device
        self._lanes = lanes
        self.state: LaneState | None = None
        self.setObjectName(f"lane_{device_label(device).replace(':', '_')}")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAcceptDrops(True)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.title_label = QLabel(self)
        self.figures_label = QLabel(self)
        self.figures_label.setWordWrap(True)
        self.bar = CapacityBar(self)
        self.blocks_label = QLabel(self)
        self.blocks_label.setWordWrap(True)
        self.blocks_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.setSpacing(3)
        layout.addWidget(self.title_label)
        layout.addWidget(self.bar)
        layout.addWidget(self.figures_label)
        layout.addWidget(self.blocks_label)

    def set_state(self, state: LaneState) -> None:
        """Show ``state``: figures, bar, blocks; red with the excess when over budget."""
        self.state = state
        chip = device_color(state.device).name()
        self.title_label.setText(f"<span style='color:{chip}'>■</span> <b>{state.title}</b>")
        figures = format_nbytes(state.used_bytes)
        if state.reserve_bytes:
            figures += f" + {format_nbytes(state.reserve_bytes)} reserve"
        if state.budget_bytes is not None:
            figures += f" / {format_nbytes(state.budget_bytes)}"
        if state.excess_bytes:
            red = over_budget_color().name()
            figures = f"<span style='color:{red}'><b>{figures} — over by {format_nbytes(state.excess_bytes)}</b></span>"
        elif not state.in_profile:
            figures += " — not in profile"
        self.figures_label.setText(figures)
        self.bar.set_state(state)
        blocks = ", ".join(state.blocks) if state.blocks else "(empty)"
        if len(blocks) > 400:
            blocks = blocks[:400] + f"… ({len(state.blocks)} blocks)"
        self.blocks_label.setText(blocks)
        self.blocks_label.setToolTip("\n".join(state.blocks[:200]))
        if self.property("overBudget") != state.over_budget:
            self.setProperty("overBudget", state.over_budget)
            self.style().unpolish(self)
            self.style().polish(self)
            # A re-polish restyles the frame but does not repaint it: the screen kept the red
            # border of a lane that fits until something else repainted it (seen under X11).
            self.update()

    # --- drops ------------------------------------------------------------------------------

    def refusal(self, mime: QMimeData) -> str | None:
        """Return why dropping ``mime`` here is refused, or ``None`` when it is allowed."""
        names = names_from_mime(mime)
        if not names:
            return "drop module rows from the tree"
        tree, device_map = self._lanes.tree, self._lanes.device_map
        if tree is None:
            return "open a model first"
        try:
            move_modules(tree, device_map, names, self.device)
        except MoveRefused as exc:
            return str(exc)
        return None

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if names_from_mime(event.mimeData()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dragMoveEvent(self, event: QDragMoveEvent) -> None:
        reason = self.refusal(event.mimeData())
        if reason is None:
            count = len(names_from_mime(event.mimeData()))
            self.drag_hint.emit(f"Drop to move {count} module(s) to {device_label(self.device)}")
            event.acceptProposedAction()
        else:
            self.drag_hint.emit(f"Cannot drop on {device_label(self.device)}: {reason}")
            event.ignore()

    def dropEvent(self, event: QDropEvent) -> None:
        if self.dropMimeData(event.mimeData()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropMimeData(self, mime: QMimeData) -> bool:
        """Move the modules ``mime`` carries to this lane's device; return whether it moved.

        A refused move reports its reason through the lanes' ``move_refused`` signal.
        """
        names = names_from_mime(mime)
        if not names:
            return False
        error = self._lanes.request_move(names, self.device)
        return error is None


class LanesWidget(QWidget):
    """All lanes plus the problems line (uncovered modules, unknown names)."""

    move_refused = Signal(str)
    drag_hint = Signal(str)

    def __init__(
        self, move_handler: MoveHandler | None = None, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.move_handler = move_handler
        self.tree: ModuleTree | None = None
        self.device_map: dict[str, int | str] = {}
        self.lanes: list[DeviceLaneWidget] = []
        self.problems: list[str] = []
        self.load_notes: list[str] = []  # why a valid map cannot load here (shared load check)
        self._map_problem_count = 0
        self.map_problems: list[str] = []  # the map is wrong for the model: it cannot load
        self.budget_problems: list[str] = []  # over budget, a device the profile lacks
        # (map measured on, device label -> note) of the loaded model's last measurement
        self._measured: tuple[dict[str, int | str], dict[str, str]] | None = None
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(4, 4, 4, 4)
        self._layout.setSpacing(6)
        self.problems_label = QLabel(self)
        self.problems_label.setWordWrap(True)
        self.problems_label.setObjectName("problemsLabel")
        self._layout.addWidget(self.problems_label)
        self._layout.addStretch(1)

    def lane(self, device: int | str) -> DeviceLaneWidget:
        """Return the lane of ``device``.

        Raises:
            KeyError: naming the devices that have lanes.
        """
        for lane in self.lanes:
            if lane.device == device:
                return lane
        have = ", ".join(device_label(lane.device) for lane in self.lanes)
        raise KeyError(f"no lane for {device!r}; lanes: {have}")

    @property
    def is_valid(self) -> bool:
        """True when every module is covered and no lane is over budget."""
        return not self.problems

    @property
    def map_valid(self) -> bool:
        """True when the map itself is valid (the loader accepts it), over budget or not."""
        return not self.map_problems

    def request_move(self, names: list[str], device: int | str) -> str | None:
        """Ask the handler to move ``names``; return the refusal message or ``None``."""
        if self.move_handler is None:
            return "no model is open"
        error = self.move_handler(names, device)
        if error:
            self.move_refused.emit(error)
        return error

    def update_lanes(
        self,
        tree: ModuleTree | None,
        device_map: Mapping[str, int | str],
        budgets: Mapping[int | str, int | None],
        *,
        reserve_bytes: int = 0,
        reserve_device: int | str | None = None,
        titles: Mapping[int | str, str] | None = None,
        load_check: LoadCheck | None = None,
        reserves: Mapping[int | str, Any] | None = None,
    ) -> None:
        """Rebuild every lane's state from the map, budgets and reserve.

        ``reserves`` (the memory model's ``DeviceReserve`` per device, with ``nbytes`` and
        ``why``) gives each device its own reserve; without it ``reserve_bytes`` is kept on
        ``reserve_device`` only.

        A budget of ``0`` means the device may hold nothing; ``None`` means no limit.
        ``load_check`` is the shared check of ``workbench.runtime.load_check``: its map
        problems make the map invalid (the loader would refuse it) and its other problems
        (devices this machine lacks, no weights) show as notes below "map valid".
        """
        self.tree = tree
        self.device_map = dict(device_map)
        titles = titles or {}
        index = MapIndex(tree, device_map) if tree is not None else None
        used = index.per_device_bytes() if index is not None else {}
        devices = sorted(set(budgets) | set(used), key=device_sort_key)
        states = []
        for device in devices:
            blocks = compact_names(index.entries_on(device)) if index is not None else []
            label = device_label(device)
            states.append(
                LaneState(
                    device=device,
                    title=f"{label} · {titles[device]}" if titles.get(device) else label,
                    used_bytes=used.get(device, 0),
                    budget_bytes=_budget_of(budgets, device),
                    reserve_bytes=_reserve_on(device, reserves, reserve_bytes, reserve_device),
                    reserve_why=getattr((reserves or {}).get(device), "why", ""),
                    blocks=tuple(blocks),
                    in_profile=device in budgets,
                )
            )
        self._sync_lane_widgets([s.device for s in states])
        self._apply_measured_notes()
        for lane, state in zip(self.lanes, states, strict=True):
            lane.set_state(state)
        problems = self._problems(index, states)
        found = self._map_problem_count
        self.map_problems = problems[:found]
        if load_check is not None and not found:  # else it would say the same again
            self.map_problems.extend(load_check.map_problems)  # what the loader would refuse
        self.budget_problems = problems[found:]
        self.problems = self.map_problems + self.budget_problems
        self.load_notes = (
            [*load_check.device_problems, *load_check.weight_problems] if load_check else []
        )
        self._show_problems()

    def show_measured(self, record: Any, device_map: Mapping[str, int | str] | None) -> None:
        """Put a ``MemoryReconciliation``'s measured figures in the capacity bars' tooltips,
        beside the predicted ones, while the lanes show ``device_map`` (the map the record was
        measured on); ``record=None`` removes them (the model is no longer loaded)."""
        if record is None or device_map is None:
            self._measured = None
        else:
            when = "after the load" if record.job == "load" else "in the last run"
            notes = {row.device: row.describe_measured(when) for row in record.devices}
            self._measured = (dict(device_map), notes)
        self._apply_measured_notes()
        for lane in self.lanes:
            if lane.state is not None:
                lane.bar.set_state(lane.state)

    def _apply_measured_notes(self) -> None:
        measured = self._measured
        current = measured is not None and measured[0] == self.device_map
        for lane in self.lanes:
            note = measured[1].get(device_label(lane.device), "") if current else ""
            lane.bar.measured_note = note

    def _problems(self, index: MapIndex | None, states: list[LaneState]) -> list[str]:
        self._map_problem_count = 0
        if index is None:
            return []
        problems = []
        uncovered = index.uncovered(limit=21)
        if uncovered:
            shown = ", ".join(compact_names(uncovered[:20]))
            more = " …" if len(uncovered) > 20 else ""
            problems.append(f"{len(uncovered)}{'+' if more else ''} uncovered: {shown}{more}")
        unknown = index.unknown_names()
        if unknown:
            problems.append(f"unknown names: {', '.join(unknown[:20])}")
        self._map_problem_count = len(problems)  # the map's own; budget problems follow
        for state in states:
            if state.excess_bytes:
                problems.append(
                    f"{device_label(state.device)} over budget by {format_nbytes(state.excess_bytes)}"
                )
            elif not state.in_profile:
                problems.append(f"{device_label(state.device)} is not in the hardware profile")
        return problems

    def _show_problems(self) -> None:
        if self.tree is None:  # no model, no map to call valid
            self.problems_label.setText("")
            self.problems_label.setStyleSheet("")
            return
        if not self.problems:
            notes = "".join(f"<br>⚠ cannot load: {_html(note)}" for note in self.load_notes)
            self.problems_label.setText(f"✔ map valid{notes}")
            self.problems_label.setStyleSheet("")
            return
        red = over_budget_color().name()
        self.problems_label.setText("⚠ " + "<br>⚠ ".join(self.problems))
        self.problems_label.setStyleSheet(f"color: {red};")

    def _sync_lane_widgets(self, devices: list[int | str]) -> None:
        if [lane.device for lane in self.lanes] == devices:
            return
        for lane in self.lanes:
            self._layout.removeWidget(lane)
            lane.hide()  # deleteLater runs later; a shown old lane would overlap the new ones
            lane.deleteLater()
        self.lanes = []
        for position, device in enumerate(devices):
            lane = DeviceLaneWidget(device, self)
            lane.drag_hint.connect(self.drag_hint)
            self._layout.insertWidget(position, lane)
            self.lanes.append(lane)


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _budget_of(budgets: Mapping[int | str, int | None], device: int | str) -> int | None:
    nbytes = budgets.get(device)
    return None if nbytes is None else int(nbytes)
