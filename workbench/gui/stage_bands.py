"""Pipeline stages as colour bands on the main module tree, with a legend.

When the cluster view shows a plan, every row of the main tree whose module one stage holds
gets a band in that stage's colour at the left of its name (children inherit their block's
stage; a parent spanning several stages, like ``model.layers``, gets one stripe per stage), and
a legend above the tree names each stage's node, GPUs and layers. The bands go when the legend's
"Clear" is pressed or another model opens (the tree model resets).

Nothing here touches the tree model: ``StageBandDelegate`` paints the Name column and reads the
row's full name through ``NAME_ROLE``; ``install_stage_bands`` fits the delegate and the legend
onto a ``ModuleTreePanel`` once.

Example:
    >>> bands = install_stage_bands(window.tree_panel)  # doctest: +SKIP
    >>> bands.set_candidate(plan.best, plan.cluster.name)  # doctest: +SKIP
    >>> bands.stages_of("model.layers.70.mlp")  # doctest: +SKIP
    (1,)
"""

from __future__ import annotations

from html import escape
from typing import Any

from PySide6.QtCore import QModelIndex, QObject, QPersistentModelIndex, QRectF, Qt, Signal
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QWidget,
)

from workbench.gui.colors import stage_color
from workbench.gui.tree_model import NAME_COLUMN, NAME_ROLE
from workbench.gui.tree_view import ModuleTreePanel

BAND_PX = 6  # width of the band drawn left of a module's name
BAND_GAP_PX = 3  # between the band and the name

AnyIndex = QModelIndex | QPersistentModelIndex


def module_stages(stage_modules: list[tuple[int, tuple[str, ...]]]) -> dict[str, tuple[int, ...]]:
    """The stages each module name belongs to, from each stage's top-level modules.

    A listed module has its stage; every ancestor of listed modules has the sorted stages of
    all of them (``model.layers`` of a two-stage plan: ``(0, 1)``). Descendants are not listed
    (``StageBands.stages_of`` walks up to the nearest listed name).

    Args:
        stage_modules: ``(stage index, module names)`` per stage, e.g. from a
            ``ClusterCandidate``: ``[(s.index, s.modules) for s in candidate.stages]``.

    Returns:
        Module name to stage indices, the whole model as ``""``.

    Example:
        >>> module_stages([(0, ("model.embed_tokens", "model.layers.0")), (1, ("lm_head",))])[
        ...     "model"
        ... ]
        (0,)
    """
    found: dict[str, set[int]] = {}
    for index, names in stage_modules:
        for name in names:
            found.setdefault(name, set()).add(index)
            parts = name.split(".")
            for depth in range(len(parts)):
                found.setdefault(".".join(parts[:depth]), set()).add(index)
    return {name: tuple(sorted(stages)) for name, stages in found.items()}


class StageBands(QObject):
    """The stage of every module for the plan shown on the main tree (none until set)."""

    changed = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("stageBands")
        self._stages: dict[str, tuple[int, ...]] = {}
        self.label = ""
        self.legend: list[tuple[int, str]] = []

    @property
    def active(self) -> bool:
        return bool(self._stages)

    def set_candidate(self, candidate: Any, cluster_name: str = "") -> None:
        """Band the tree by ``candidate``'s stages (a ``ClusterCandidate``); ``None`` clears."""
        if candidate is None:
            self.clear()
            return
        self._stages = module_stages([(s.index, s.modules) for s in candidate.stages])
        where = f" on {cluster_name}" if cluster_name else ""
        verdict = "" if candidate.fits else ", does not fit"
        self.label = f"{candidate.label}{where}{verdict}"
        self.legend = [(s.index, stage_words(s)) for s in candidate.stages]
        self.changed.emit()

    def clear(self) -> None:
        """Remove the bands (the plan was cleared, or another model opened)."""
        if not self._stages and not self.legend:
            return
        self._stages, self.label, self.legend = {}, "", []
        self.changed.emit()

    def stages_of(self, name: str) -> tuple[int, ...]:
        """Stages holding module ``name``: its own entry, else its nearest listed ancestor's
        when that is one stage (a layer's ``mlp`` is on the layer's stage); ``()`` if none."""
        if not self._stages:
            return ()
        if name in self._stages:
            return self._stages[name]
        parts = name.split(".")
        for depth in range(len(parts) - 1, 0, -1):
            stages = self._stages.get(".".join(parts[:depth]))
            if stages is not None:
                return stages if len(stages) == 1 else ()
        return ()


def stage_words(stage: Any) -> str:
    """``"h100-node0 GPUs 0-7, layers 0-62"``: where a ``StagePlan`` runs and what it holds."""
    gpus = list(stage.gpus)
    gpu_words = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {gpus[0]}-{gpus[-1]}"
    last = stage.first_layer + stage.layer_count - 1
    return f"{stage.node_name} {gpu_words}, layers {stage.first_layer}-{last}"


class StageBandDelegate(QStyledItemDelegate):
    """Paints the Name column with its stage band(s) left of the text."""

    def __init__(self, bands: StageBands, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bands = bands

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: AnyIndex) -> None:
        stages = self.bands.stages_of(index.data(NAME_ROLE) or "")
        if not stages:
            super().paint(painter, option, index)
            return
        shifted = QStyleOptionViewItem(option)
        shifted.rect = option.rect.adjusted(BAND_PX + BAND_GAP_PX, 0, 0, 0)
        super().paint(painter, shifted, index)
        band = QRectF(option.rect.left() + 1, option.rect.top() + 1, BAND_PX, 0)
        band.setHeight(option.rect.height() - 2)
        stripe = band.height() / len(stages)
        painter.save()
        painter.setPen(Qt.PenStyle.NoPen)
        for k, stage in enumerate(stages):
            painter.setBrush(stage_color(stage))
            painter.drawRect(QRectF(band.left(), band.top() + k * stripe, BAND_PX, stripe))
        painter.restore()


class StageLegend(QWidget):
    """One line per plan: a colour chip and the node, GPUs and layers of each stage; Clear."""

    def __init__(self, bands: StageBands, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("stageLegend")
        self.bands = bands
        self.text = QLabel(self)
        self.text.setWordWrap(True)
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setAccessibleName("Pipeline stages")
        self.clear_button = QPushButton("Clear", self)
        self.clear_button.setToolTip("Remove the stage bands from the module tree")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.text, 1)
        layout.addWidget(self.clear_button, 0, Qt.AlignmentFlag.AlignTop)
        self.clear_button.clicked.connect(bands.clear)
        bands.changed.connect(self._on_bands_changed)
        self._on_bands_changed()

    def _on_bands_changed(self) -> None:
        self.setVisible(self.bands.active)
        chips = [
            f"<span style='background-color:{stage_color(index).name()}'>&nbsp;&nbsp;&nbsp;"
            f"</span>&nbsp;stage {index}: {escape(words)}"
            for index, words in self.bands.legend
        ]
        self.text.setText(f"<b>Stages</b> ({escape(self.bands.label)}): " + " &nbsp; ".join(chips))


def install_stage_bands(panel: ModuleTreePanel) -> StageBands:
    """The panel's ``StageBands``, fitted on first call: the Name column's delegate, the legend
    above the tree, and clearing when the tree model resets (another model opened)."""
    existing = panel.findChild(StageBands, "stageBands")
    if isinstance(existing, StageBands):
        return existing
    bands = StageBands(panel)
    panel.view.setItemDelegateForColumn(NAME_COLUMN, StageBandDelegate(bands, panel.view))
    legend = StageLegend(bands, panel)
    layout = panel.layout()
    layout.insertWidget(max(layout.indexOf(panel.view), 0), legend)  # type: ignore[attr-defined]
    bands.changed.connect(panel.view.viewport().update)
    widened = [False]  # the Name column gives the band its room while bands are shown

    def _on_model_reset() -> None:
        widened[0] = False  # the panel has just sized the columns afresh
        bands.clear()

    panel.model.modelReset.connect(_on_model_reset)

    def _on_bands_changed() -> None:
        if bands.active != widened[0]:
            header = panel.view.header()
            step = BAND_PX + BAND_GAP_PX if bands.active else -(BAND_PX + BAND_GAP_PX)
            header.resizeSection(NAME_COLUMN, header.sectionSize(NAME_COLUMN) + step)
            widened[0] = bands.active

    bands.changed.connect(_on_bands_changed)
    return bands
