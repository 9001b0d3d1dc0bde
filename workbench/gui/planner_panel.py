"""The planner panel: options, candidate maps of several strategies side by side, apply.

Options are prefilled from the session and the model (budgets, dtype, no-split classes).
The reserve is the memory model's (batch, context, KV dtype, MLA engine; persisted in
``QSettings``): each device keeps free the KV cache of the layers it runs plus their
activation peak (``runtime.planning.device_reserves``, which the lanes show too), or a fixed
number of bytes on the execution device. Config keys the memory model does not understand
are named in a warning line under the options. "Compare" plans every checked strategy
on a worker thread and fills a table with per-device totals and predicted speed per strategy;
nothing changes until "Apply", which is one undo macro (budgets, reserve and map, and the
planning dtype when it differs from the tree's, so the lanes count bytes as the plan did). The
"Why" list starts with each device's reserve in words ("layers 0-39 on cuda:0 need 1.25 GiB
of KV cache at 8k context, bf16, GQA 8 of 64 heads; ...") and explains each placement of the
selected strategy in its tooltip. Warnings the
planner raises for a strategy (buffers no GPU can hold, …) show in its status cell and at the
top of its trace; every budgeted device has a row, so an unused GPU shows as 0 B. The table is
as tall as its rows; the trace takes the rest of the panel.

The budgets are the session's (one budget per device): the panel's editor and the Budgets dock
show the same values, and an edit in either is one undo step. A comparison made for other
hardware or budgets than the session has now is stale: its Apply buttons are disabled until the
next comparison, so old budgets are never written back.

The comparison belongs to the opened model: it is kept in the session's ``ModelContext``, so
opening another model empties the table and the "Why" list, and a comparison still running for
the previous model is dropped when it finishes. ``plan_and_apply`` (the toolbar's Plan, Ctrl+P)
plans with the current strategy and applies the result as one undo step. A plan's status says
"ok" only when the shared load check (``workbench.runtime.load_check``) accepts its map.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from workbench.gui.colors import device_color, warning_color
from workbench.gui.commands import push_plan
from workbench.gui.hardware_selector import BudgetEditor
from workbench.gui.pareto_view import ParetoView, PrecisionOptions, apply_joint
from workbench.gui.planner_table import RowsTable, status_item
from workbench.gui.reserve_controls import ReserveControls
from workbench.gui.window_context import PlannerHost
from workbench.gui.workers import TaskThread
from workbench.runtime import AS_STORED, DTYPE_CHOICES, device_label, device_sort_key, dtype_name
from workbench.runtime.formatting import format_nbytes, format_rate, format_seconds
from workbench.runtime.model_context import Comparison, ModelContext
from workbench.runtime.model_kind import generates_tokens
from workbench.runtime.planning import (
    MemoryOptions,
    attention_layout,
    device_reserves,
    execution_reserve,
)
from workbench.runtime.precision_session import JOINT_STRATEGY
from workbench.runtime.strategy_compare import STRATEGIES, Candidate, PlanRequest, run_comparison

logger = logging.getLogger(__name__)

DTYPES = (AS_STORED, *DTYPE_CHOICES)
WARNING_COLOR = warning_color()
APPLY_COLUMNS = 3


class PlannerPanel(QWidget):
    """Side panel of the main window; ``comparison_ready`` fires when the table is filled."""

    comparison_ready = Signal(object)
    comparison_failed = Signal(str)

    def __init__(self, window: PlannerHost) -> None:
        super().__init__(window)  # type: ignore[arg-type]  # the host is the window
        self.window_ = window
        self.thread: TaskThread | None = None
        self._pending: tuple[Any, ...] | None = None  # what the running comparison was for
        self._apply_when_done: str | None = None  # plan_and_apply's strategy, while it plans
        self.apply_buttons: dict[str, QPushButton] = {}
        self.budget_editor = BudgetEditor(self)
        self.budget_editor.setAccessibleName("Planner budgets (the session's)")
        self.strategy_combo = QComboBox(self)
        self.strategy_combo.addItems(STRATEGIES)
        self.strategy_combo.setToolTip("The strategy Plan (Ctrl+P) uses; Apply sets it too")
        self.dtype_combo = QComboBox(self)
        self.dtype_combo.addItems(DTYPES)
        self.no_split_edit = QLineEdit(self)
        self.no_split_edit.setPlaceholderText("class names, comma separated")
        self.reserve_controls = ReserveControls(self)
        controls = self.reserve_controls
        # the controls by their old names (the window and the tests use them)
        self.reserve_by_shape, self.reserve_by_bytes = controls.by_model, controls.by_bytes
        self.batch_spin, self.context_spin = controls.batch_spin, controls.context_spin
        self.reserve_gib, self.memory_note = controls.reserve_gib, controls.note
        self.strategy_checks = {s: QCheckBox(s, self) for s in STRATEGIES}
        for check in self.strategy_checks.values():
            check.setChecked(True)
        self.precision_options = PrecisionOptions(self)  # the precision+placement row
        self.pareto_view: ParetoView | None = None
        self.compare_button = QPushButton("Compare strategies", self)
        self.compare_button.setDefault(True)
        self.table = RowsTable(self)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.apply_row = QGridLayout()  # APPLY_COLUMNS buttons a row: the panel stays narrow
        self.stale_label = QLabel(self)  # says so when the table no longer matches the session
        self.stale_label.setObjectName("plannerStaleLabel")
        self.stale_label.setWordWrap(True)
        self.stale_label.setVisible(False)
        self.trace_view = QTreeWidget(self)
        self.trace_view.setHeaderLabels(["Module", "Device", "Size", "Why"])
        self.trace_view.setRootIsDecorated(False)
        self.trace_view.setUniformRowHeights(True)
        self.trace_view.setMinimumHeight(  # the header and six rows stay in view
            self.trace_view.header().sizeHint().height()
            + 6 * (self.fontMetrics().height() + 2)
            + 2 * self.trace_view.frameWidth()
        )
        self._build_layout()
        self.compare_button.clicked.connect(lambda _checked=False: self.compare())
        self.table.currentCellChanged.connect(self._on_table_current_cell_changed)
        # one budget per device: an edit here is the same undo step as one in the Budgets dock
        self.budget_editor.budgets_edited.connect(window.edit_budgets)
        controls.changed.connect(self._on_reserve_controls_changed)
        self.precision_options.pareto_requested.connect(self.show_pareto)

    def _build_layout(self) -> None:
        form = QFormLayout()
        form.addRow("Budgets", self.budget_editor)
        form.addRow("Planning dtype", self.dtype_combo)
        form.addRow("No-split classes", self.no_split_edit)
        # two rows, two columns: the panel stays narrow enough to sit beside the tree and lanes
        form.addRow("Reserve", self.reserve_controls)
        strategies_grid = QGridLayout()
        for position, check in enumerate(self.strategy_checks.values()):
            strategies_grid.addWidget(check, position // 2, position % 2)
        form.addRow("Strategies", strategies_grid)
        form.addRow("Precisions", self.precision_options)
        form.setVerticalSpacing(3)  # tight rows leave the trace more room
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(4)
        layout.addLayout(form)
        buttons = QHBoxLayout()  # one row: the dock keeps its height for the trace
        plan_with = QLabel("Plan with", self)
        plan_with.setBuddy(self.strategy_combo)
        buttons.addWidget(plan_with)
        buttons.addWidget(self.strategy_combo)
        buttons.addWidget(self.compare_button, 1)
        layout.addLayout(buttons)
        layout.addWidget(self.stale_label)
        layout.addWidget(self.table)  # as tall as its rows: the trace below takes the rest
        layout.addLayout(self.apply_row)
        layout.addWidget(self.trace_view, 1)

    # --- options --------------------------------------------------------------------------

    @property
    def context(self) -> ModelContext | None:
        """The opened model's context, which holds the comparison this panel shows."""
        return self.window_.session.context

    @property
    def comparison(self) -> Comparison | None:
        """The opened model's last comparison (``None`` before one, or for another model)."""
        context = self.context
        return None if context is None else context.comparison

    @property
    def candidates(self) -> list[Candidate]:
        """The candidates of the opened model's comparison, in the table's order."""
        comparison = self.comparison
        return [] if comparison is None else list(comparison.candidates)

    @property
    def _request(self) -> PlanRequest | None:
        comparison = self.comparison
        return None if comparison is None else comparison.request

    def set_model(self, opened: Any) -> None:
        """Prefill from a newly opened model: no-split classes, dtype, budgets; the table and
        the "Why" list show the new model's (empty) comparison."""
        self.no_split_edit.setText(", ".join(getattr(opened, "no_split_modules", []) or []))
        name = dtype_name(getattr(opened, "planning_dtype", None))
        self.dtype_combo.setCurrentText(name if name in DTYPES else AS_STORED)
        self.reserve_by_shape.setChecked(True)  # estimated for this model, not a typed leftover
        self.reserve_controls.update_note(opened)
        self.sync_from_session()
        self._fill_table()

    # --- the memory model -------------------------------------------------------------------

    def _on_reserve_controls_changed(self) -> None:
        """The lanes show the reserve the new options give at once; a comparison made with
        other options is out of date."""
        opened = self.window_.session.opened
        self.reserve_controls.update_note(opened)
        if opened is not None:
            self.window_.session.set_memory(self.memory_options(), reason="reserve options")
            self.window_.refresh()
        self._update_apply_buttons()

    def memory_options(self) -> MemoryOptions | None:
        """The memory model's options (``None`` with a fixed reserve in bytes)."""
        return self.reserve_controls.memory_options()

    def _planning_memory(self) -> MemoryOptions | None:
        """``memory_options``, or ``None`` for a model the memory model cannot read (planned
        without a reserve, as the lanes show it)."""
        options, opened = self.memory_options(), self.window_.session.opened
        if options is None or opened is None:
            return options
        try:
            attention_layout(opened)
        except (ValueError, TypeError, AttributeError) as exc:
            logger.info("planning without a memory-model reserve: %s", str(exc))
            return None
        return options

    def lane_reserves(self, device_map: dict[str, Any]) -> dict[Any, Any] | None:
        """Each device's ``DeviceReserve`` for ``device_map`` (what the lanes show), or
        ``None`` with a fixed reserve or a model the memory model cannot read (the lanes
        then show the session's reserve on the execution device)."""
        options, opened = self.memory_options(), self.window_.session.opened
        if options is None or opened is None or not device_map:
            return None
        try:
            return device_reserves(opened, device_map, options, self.window_.session.precision_map)
        except (ValueError, TypeError, AttributeError) as exc:
            logger.info("no memory model for the lanes: %s", str(exc))
            return None

    def sync_from_session(self) -> None:
        """Copy the session's budgets into the panel's editor (called on every hardware or
        budget change) and disable the Apply buttons of a comparison that became stale."""
        session = self.window_.session
        profile = session.profile
        titles = {spec.device: spec.name for spec in profile.devices} if profile else {}
        self.budget_editor.set_budgets(dict(session.budgets), titles)
        self._update_apply_buttons()

    def stale_reason(self) -> str | None:
        """Why the compared plans no longer fit the session's hardware, or ``None``."""
        comparison = self.comparison
        if comparison is None:
            return None
        session = self.window_.session
        current = getattr(session.profile, "name", None)
        if current != comparison.profile_name:
            return f"the hardware changed to {current} since the comparison; compare again"
        if dict(session.budgets) not in (
            dict(comparison.budgets),
            dict(comparison.request.budgets),
        ):
            return "the budgets changed since the comparison; compare again"
        if comparison.request.memory != self._planning_memory():
            return "the reserve options changed since the comparison; compare again"
        return None

    def reserve_bytes(self) -> int:
        """The reserve of the execution device: the fixed bytes, or the memory model's for
        every layer on it (what a map ``{"": device}`` needs; 0 without a readable config)."""
        options = self.memory_options()
        if options is None:
            return self.reserve_controls.fixed_bytes()
        opened = self.window_.session.opened
        if opened is None:
            return 0
        try:
            return execution_reserve(opened, options)
        except (ValueError, TypeError, AttributeError) as exc:
            logger.warning("cannot estimate the activation reserve: %s", str(exc))
            return 0

    def request(self) -> PlanRequest | None:
        """Capture the options as a ``PlanRequest`` (``None`` without a model)."""
        session = self.window_.session
        if session.opened is None:
            return None
        dtype = self.dtype_combo.currentText()
        memory = self._planning_memory()
        reserve = 0 if memory is not None else self.reserve_bytes()
        device = self.window_.execution_device()
        return PlanRequest(
            opened=session.opened,
            model=session.opened.model,
            tree=session.tree,
            profile=self.window_.hardware_profile(),
            budgets=dict(session.budgets),
            reserve={device: reserve} if reserve else {},
            dtype=None if dtype == AS_STORED else dtype,
            no_split=[n.strip() for n in self.no_split_edit.text().split(",") if n.strip()],
            strategies=tuple(s for s, c in self.strategy_checks.items() if c.isChecked()),
            memory=memory,
            precisions=self.precision_options.precisions(),
            min_bits=self.precision_options.min_bits(),
        )

    # --- comparing ----------------------------------------------------------------------------

    def current_strategy(self) -> str:
        """The strategy Plan (Ctrl+P) uses: the one chosen under "Plan with"."""
        return self.strategy_combo.currentText()

    def plan_and_apply(self) -> TaskThread | None:
        """Plan with the current strategy and apply the map as one undo step when it fits
        (the toolbar's Plan and Ctrl+P); "Compare strategies" still compares them all."""
        strategy = self.current_strategy()
        thread = self.compare((strategy,))
        if thread is not None:
            self._apply_when_done = strategy
            self.window_.statusBar().showMessage(f"Planning with {strategy}…")
        return thread

    def compare(self, strategies: tuple[str, ...] | None = None) -> TaskThread | None:
        """Plan the checked strategies (or ``strategies``) on a worker thread; the table
        fills when done."""
        request = self.request()
        if request is None:
            self.window_.statusBar().showMessage("Open a model before planning", 3000)
            return None
        if self.thread is not None and self.thread.isRunning():
            return None
        if strategies is not None:
            request = dataclasses.replace(request, strategies=tuple(strategies))
        self._apply_when_done = None
        session = self.window_.session
        context = session.context
        profile_name = getattr(session.profile, "name", None)
        budgets = dict(session.budgets)
        self.compare_button.setEnabled(False)
        self.compare_button.setText("Planning…")
        self.thread = TaskThread(run_comparison, request)
        self.thread.setObjectName("compare plans")
        # Held here, not in a closure on the thread's signal: the panel keeps its last thread,
        # and a closure would keep this model (and its tree) alive after another is opened.
        self._pending = (request, profile_name, budgets, context)
        self.thread.succeeded.connect(self._on_candidates_ready)
        self.thread.failed.connect(self._on_thread_failed)
        self.thread.start()
        return self.thread

    def _on_candidates_ready(self, candidates: Any) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        request, profile_name, budgets, context = pending
        self._on_thread_succeeded(
            Comparison(request, tuple(candidates), profile_name, budgets), context
        )

    def _on_thread_succeeded(self, comparison: Comparison, context: ModelContext | None) -> None:
        self._reset_button()
        strategy, self._apply_when_done = self._apply_when_done, None
        if context is None or context is not self.context:  # planned for a model now closed
            logger.info("dropped a comparison made for %s", getattr(context, "source", None))
            return
        context.comparison = comparison
        candidates = list(comparison.candidates)
        self._fill_table()
        warned = [c for c in candidates if c.warnings]
        if warned:
            first = warned[0]
            self.window_.statusBar().showMessage(
                f"Planner warning ({', '.join(c.strategy for c in warned)}): {first.warnings[0]}",
                15000,
            )
        self.comparison_ready.emit(candidates)
        if strategy is not None:
            self._apply_planned(strategy)

    def _apply_planned(self, strategy: str) -> None:
        candidate = self.candidate(strategy)
        if candidate is not None and candidate.plan is not None:
            self.apply(strategy)
            return
        reason = candidate.error if candidate is not None else "no plan"
        self.window_.statusBar().showMessage(f"The {strategy} plan does not fit: {reason}", 15000)

    def _on_thread_failed(self, exc: BaseException) -> None:
        self._pending = None
        self._reset_button()
        self._apply_when_done = None
        self.window_.show_error("Planning failed", str(exc))
        self.comparison_failed.emit(str(exc))

    def _reset_button(self) -> None:
        self.compare_button.setEnabled(True)
        self.compare_button.setText("Compare strategies")

    def _fill_table(self) -> None:
        candidates = self.candidates
        budgets = self._request.budgets if self._request else {}
        # every budgeted device, even one a plan leaves empty: 0 B shows an unused GPU
        devices = sorted(
            set(budgets) | {d for c in candidates if c.plan for d in c.plan.per_device_bytes},
            key=device_sort_key,
        )
        if not candidates:
            devices = []
        # a model that generates nothing is timed by one forward: no tokens/s or TTFT for it
        generates = generates_tokens(self.window_.session.opened)
        speed_rows = ["tokens/s", "TTFT"] if generates else ["forward"]
        rows = [device_label(d) for d in devices] + speed_rows + ["status"]
        self.table.clear()
        self.table.setRowCount(len(rows))
        self.table.setColumnCount(len(candidates))
        self.table.setVerticalHeaderLabels(rows)
        self.table.setHorizontalHeaderLabels([c.strategy for c in candidates])
        for column, candidate in enumerate(candidates):
            for row, device in enumerate(devices):
                nbytes = candidate.plan.per_device_bytes.get(device, 0) if candidate.plan else 0
                item = QTableWidgetItem(format_nbytes(nbytes) if candidate.plan else "")
                item.setForeground(device_color(device))
                if budgets.get(device) is not None and candidate.plan:
                    tip = f"{format_nbytes(nbytes)} of {format_nbytes(budgets[device])}"
                    reserve = candidate.plan.reserve.get(device, 0)
                    if reserve:
                        tip += f", + {format_nbytes(reserve)} reserve"
                    why = candidate.plan.reserve_why.get(device)
                    item.setToolTip(f"{tip}\n{why}" if why else tip)
                self.table.setItem(row, column, item)
            prediction = candidate.prediction
            if not prediction:
                figures = ["—"] * len(speed_rows)
            elif generates:
                figures = [format_rate(prediction.tokens_per_s), format_seconds(prediction.ttft_s)]
            else:
                figures = [format_seconds(prediction.prefill_s)]
            for offset, text in enumerate(figures):
                self.table.setItem(len(devices) + offset, column, QTableWidgetItem(text))
            status_row = len(devices) + len(speed_rows)
            self.table.setItem(status_row, column, status_item(candidate, self._request))
        self.table.resizeColumnsToContents()
        self.table.setVisible(bool(candidates))  # no empty "tokens/s, TTFT, status" rows
        self.table.updateGeometry()
        self._fill_apply_buttons()
        joint = self.candidate(JOINT_STRATEGY)
        has_joint = joint is not None and joint.joint is not None
        self.precision_options.pareto_button.setEnabled(has_joint)
        if candidates:
            self.table.setCurrentCell(0, 0)
            self.show_trace(candidates[0].strategy)
        else:  # another model, or none: the "Why" list never keeps the previous one's rows
            self.trace_view.clear()

    def _fill_apply_buttons(self) -> None:
        while self.apply_row.count():
            item = self.apply_row.takeAt(0)
            if item.widget() is not None:
                item.widget().deleteLater()
        self.apply_buttons = {}
        for position, candidate in enumerate(self.candidates):
            button = QPushButton(f"Apply {candidate.strategy}", self)
            button.clicked.connect(lambda _c=False, s=candidate.strategy: self.apply(s))
            row, column = divmod(position, APPLY_COLUMNS)
            self.apply_row.addWidget(button, row, column)
            self.apply_buttons[candidate.strategy] = button
        self._update_apply_buttons()

    def _update_apply_buttons(self) -> None:
        stale = self.stale_reason()
        self.stale_label.setText(f"Out of date: {stale}" if stale else "")
        self.stale_label.setStyleSheet(f"color: {warning_color().name()};" if stale else "")
        self.stale_label.setVisible(stale is not None and bool(self.apply_buttons))
        for strategy, button in self.apply_buttons.items():
            candidate = self.candidate(strategy)
            error = candidate.error if candidate is not None else "no plan"
            button.setEnabled(
                stale is None and candidate is not None and candidate.plan is not None
            )
            button.setToolTip(stale or error or "Apply this map (one undo step)")

    def _on_table_current_cell_changed(self, _row: int, column: int, *_previous: int) -> None:
        if 0 <= column < len(self.candidates):
            self.show_trace(self.candidates[column].strategy)

    def show_trace(self, strategy: str) -> None:
        """List the placements of ``strategy``; each row's tooltip is the planner's reason."""
        self.trace_view.clear()
        candidate = self.candidate(strategy)
        for text in candidate.warnings if candidate is not None else ():
            item = QTreeWidgetItem(["(warning)", "", "", text])
            for column in range(4):
                item.setToolTip(column, text)
                item.setForeground(column, WARNING_COLOR)
            self.trace_view.addTopLevelItem(item)
        if candidate is None or candidate.plan is None:
            if candidate is not None:
                item = QTreeWidgetItem(["(no plan)", "", "", candidate.error])
                item.setToolTip(3, candidate.error)
                self.trace_view.addTopLevelItem(item)
            return
        items = []
        plan = candidate.plan
        for device in sorted(plan.reserve, key=device_sort_key):
            why = plan.reserve_why.get(device) or "fixed reserve (bytes)"
            item = QTreeWidgetItem(
                ["(reserve)", device_label(device), format_nbytes(plan.reserve[device]), why]
            )
            for column in range(4):
                item.setToolTip(column, why)
            item.setForeground(1, device_color(device))
            items.append(item)
        for placement in candidate.plan.trace[:5000]:
            device = "split" if placement.device is None else device_label(placement.device)
            item = QTreeWidgetItem(
                [
                    placement.module or "(model)",
                    device,
                    format_nbytes(placement.nbytes),
                    placement.reason,
                ]
            )
            for column in range(4):
                item.setToolTip(column, placement.reason)
            if placement.device is not None:
                item.setForeground(1, device_color(placement.device))
            items.append(item)
        self.trace_view.addTopLevelItems(items)
        self.trace_view.resizeColumnToContents(0)

    def show_pareto(self) -> ParetoView | None:
        """Open the Pareto view of the precision+placement row (``None`` without one)."""
        candidate = self.candidate(JOINT_STRATEGY)
        if candidate is None or candidate.joint is None:
            return None
        if self.pareto_view is not None:
            self.pareto_view.close()
            self.pareto_view.deleteLater()
        self.pareto_view = ParetoView(self.window_, candidate, stale_reason=self.stale_reason)
        self.pareto_view.show()
        return self.pareto_view

    def _select(self, strategy: str) -> None:
        """Make ``strategy``'s column the table's current one (its trace shows below)."""
        columns = [candidate.strategy for candidate in self.candidates]
        if strategy in columns:
            self.table.setCurrentCell(max(self.table.currentRow(), 0), columns.index(strategy))

    def candidate(self, strategy: str) -> Candidate | None:
        comparison = self.comparison
        return None if comparison is None else comparison.candidate(strategy)

    def apply(self, strategy: str) -> bool:
        """Apply a compared strategy as one undo macro; return whether it applied.

        Refused (returns False, says why in the status bar) when the comparison is stale.
        """
        candidate = self.candidate(strategy)
        if candidate is None or candidate.plan is None or self._request is None:
            return False
        window = self.window_
        stale = self.stale_reason()
        if stale is not None:
            window.statusBar().showMessage(f"Cannot apply the {strategy} plan: {stale}", 8000)
            return False
        self._select(strategy)  # its column and its trace: what the lanes now show
        if candidate.joint is not None:  # precisions and map together, one undo step
            return apply_joint(window, candidate, self._request.budgets)
        if self._request.memory is None:
            reserve = sum(self._request.reserve.values())
        else:  # the session keeps the execution device's share; the lanes show every device's
            reserve = candidate.plan.reserve.get(window.execution_device(), 0)
        applied = push_plan(
            window.undo_stack,
            window.session,
            candidate.plan.device_map,
            strategy=strategy,
            budgets=self._request.budgets,
            reserve=reserve,
            opened=candidate.opened,
            dtype=self._request.dtype,
        )
        self.strategy_combo.setCurrentText(strategy)  # Plan (Ctrl+P) uses it from now on
        window.tree_model.set_trace(
            {p.module: p.reason for p in candidate.plan.trace}, candidate.plan.device_map
        )
        if not applied:  # nothing to change: no undo step, the document stays as it is
            window.statusBar().showMessage(
                f"The {strategy} plan equals the current map: nothing to apply", 5000
            )
            return False
        window.statusBar().showMessage(f"Applied the {strategy} plan", 5000)
        return True
