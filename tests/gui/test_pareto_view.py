"""The Pareto view of the joint planner: every candidate on a scatter, click previews it on
the lanes, double-click applies precisions and map as one undo step; the comparison's
precision+placement row."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QEvent, QPoint, QPointF, Qt
from PySide6.QtGui import QMouseEvent
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication
from user_input import compare_strategies

from workbench.gui.tree_model import PRECISION_COLUMN
from workbench.runtime.map_edits import MapIndex

pytestmark = pytest.mark.gui

# tiny_opened in float32: embed 16x8 (tied with head, kept), 4 blocks of 2 Linear(8, 8)
# = 2 x (64 + 8) x 4 B = 576 B each; int8 stores each 8x8 weight as 64 B + 8 scales.
BUDGETS = {0: 1500, 1: 0, "cpu": 10_000, "disk": 10**9}


@pytest.fixture
def joint_window(main_window, tiny_opened):
    """``main_window`` on ``tiny_opened`` (everything on cpu), with the config's declared dtype
    the joint planner reads (none: the tree's float32)."""
    opened = type(tiny_opened)(**{**tiny_opened.__dict__, "declared_dtype": None})
    main_window.set_opened("tiny-lm", opened, {"": "cpu"})
    return main_window


def _joint_comparison(qtbot, window):
    panel = window.planner_panel
    for strategy, check in panel.strategy_checks.items():
        check.setChecked(strategy == "sequential")
    panel.precision_options.precisions_edit.setText("int8,fp32")
    candidates = compare_strategies(qtbot, window, BUDGETS)
    assert not window.errors, window.errors
    joint = panel.candidate("precision+placement")
    assert joint is not None and joint.joint is not None, [c.error for c in candidates]
    return panel, joint


def _settled_point(qtbot, view, x: float, y: float) -> QPoint:
    """Where (x, y) is on the plot's viewport once the axes stopped resizing (their tick
    labels are laid out over a few events after the view is shown)."""
    vb = view.plot.getPlotItem().getViewBox()

    def where() -> QPoint:
        return view.plot.mapFromScene(vb.mapViewToScene(QPointF(x, y)))

    seen: list[QPoint] = []

    def settled() -> bool:
        QApplication.processEvents()
        seen.append(where())
        return len(seen) > 2 and seen[-1] == seen[-2] == seen[-3]

    qtbot.waitUntil(settled)
    return seen[-1]


def _scene_click(qtbot, view, index: int, *, double: bool = False) -> None:
    """Click (or double-click) the plot where candidate ``index`` is drawn, with real mouse
    events on the plot's viewport (pyqtgraph turns them into the scatter's ``sigClicked``)."""
    viewport = view.plot.viewport()
    point = _settled_point(qtbot, view, *view.point_xy(index))
    left, none = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    QTest.mouseClick(viewport, left, none, point)
    if double:  # QTest.mouseDClick sends no press first; a double click is click + dblclick
        where, screen = QPointF(point), QPointF(viewport.mapToGlobal(point))
        for kind, buttons in (
            (QEvent.Type.MouseButtonDblClick, left),
            (QEvent.Type.MouseButtonRelease, Qt.MouseButton.NoButton),
        ):
            QApplication.sendEvent(viewport, QMouseEvent(kind, where, screen, left, buttons, none))


def test_the_comparison_has_a_precision_and_placement_row(qtbot, joint_window) -> None:
    panel, joint = _joint_comparison(qtbot, joint_window)
    headers = [panel.table.horizontalHeaderItem(c).text() for c in range(panel.table.columnCount())]
    assert headers == ["sequential", "precision+placement"]
    plan = joint.joint.joint.plan
    assert set(plan.precision_map) == {f"layers.{i}" for i in range(4)}
    # the row's bytes are the quantized ones: the lanes' arithmetic over the resized tree
    index = MapIndex(joint.joint.tree, plan.device_map)
    assert index.per_device_bytes() == {d: n for d, n in joint.plan.per_device_bytes.items() if n}
    assert panel.precision_options.pareto_button.isEnabled()
    assert panel.apply("precision+placement")
    session = joint_window.session
    assert session.precision_map == plan.precision_map
    assert session.device_map == plan.device_map
    joint_window.undo_stack.undo()
    assert session.precision_map == {}


def test_click_previews_and_double_click_applies_one_undo_step(qtbot, joint_window) -> None:
    window = joint_window
    panel, joint = _joint_comparison(qtbot, window)
    view = panel.show_pareto()
    assert view is not None
    qtbot.waitExposed(view)
    candidates = view.candidates
    assert len(view.scatter.points()) == len(candidates) == len(joint.joint.joint.plan.candidates)
    session = window.session
    before_map, before_precisions = dict(session.device_map), dict(session.precision_map)
    depth = window.undo_stack.count()
    # a candidate other than the planner's choice, that fits
    target = next(i for i, c in enumerate(candidates) if c.feasible and c is not view.plan.chosen)
    with qtbot.waitSignal(view.previewed, timeout=5000) as previewed:
        _scene_click(qtbot, view, target)
    assert previewed.args == [target]
    shown = candidates[target]
    assert window.lanes.device_map == shown.device_map  # the lanes show it ...
    assert session.device_map == before_map  # ... the document is untouched
    assert window.undo_stack.count() == depth
    with qtbot.waitSignal(view.applied, timeout=5000):
        _scene_click(qtbot, view, target, double=True)
    assert session.device_map == shown.device_map
    assert session.precision_map == shown.precision_map
    assert window.undo_stack.count() == depth + 1
    row = window.tree_model.index_of("layers.0", PRECISION_COLUMN)
    assert row.data() == shown.precision_map["layers.0"]
    window.undo_stack.undo()  # one step takes both back
    assert session.device_map == before_map
    assert session.precision_map == before_precisions
    view.close()


def test_a_stale_comparison_previews_but_never_applies(qtbot, joint_window) -> None:
    window = joint_window
    panel, _joint = _joint_comparison(qtbot, window)
    view = panel.show_pareto()
    assert view is not None
    window.edit_budgets({**BUDGETS, 0: 1400})  # other budgets than the comparison's
    depth = window.undo_stack.count()
    chosen = next(i for i, c in enumerate(view.candidates) if c is view.plan.chosen)
    assert view.preview(chosen)
    assert not view.apply(chosen)
    assert window.undo_stack.count() == depth
    assert window.session.precision_map == {}
    assert "budgets changed" in window.statusBar().currentMessage()
    view.close()
