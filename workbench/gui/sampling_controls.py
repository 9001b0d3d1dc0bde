"""How the next token is chosen: greedy, or sampled with temperature, top-p, top-k and a seed;
a repetition penalty in both modes.

``SamplingControls.sampling()`` gives the ``Sampling`` the worker uses; ``summary()`` one
line for people. With Greedy ticked the sampling-only settings are disabled (they would do
nothing), so what the controls show is what the run does.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QDoubleSpinBox, QFormLayout, QSpinBox, QWidget

from workbench.runtime.protocol import Sampling


class SamplingControls(QWidget):
    """Greedy, temperature, top-p, top-k, repetition penalty, seed.

    Signals:
        changed(): any setting changed.
    """

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.greedy_check = QCheckBox("greedy (always the most likely token)", self)
        self.greedy_check.setChecked(True)
        self.greedy_check.setToolTip(
            "Greedy: take the most likely token every step (repeatable, no seed). Untick to "
            "sample with the temperature, top-p, top-k and seed below"
        )
        self.temperature_spin = _double(self, 0.01, 5.0, 0.05, 0.7, 2)
        self.temperature_spin.setToolTip(
            "Divides the logits before sampling: below 1 sharper (safer), above 1 flatter "
            "(more varied)"
        )
        self.top_p_spin = _double(self, 0.01, 1.0, 0.05, 0.9, 2)
        self.top_p_spin.setToolTip(
            "Nucleus sampling: draw only from the most likely tokens whose probabilities add up "
            "to top-p (1: all tokens)"
        )
        self.top_k_spin = QSpinBox(self)
        self.top_k_spin.setRange(0, 100_000)
        self.top_k_spin.setValue(50)
        self.top_k_spin.setSpecialValueText("off")
        self.top_k_spin.setToolTip("Draw only from the k most likely tokens (off: no limit)")
        self.repetition_spin = _double(self, 0.5, 10.0, 0.05, 1.0, 2)
        self.repetition_spin.setToolTip(
            "Above 1, tokens already in the prompt or the answer become less likely (greedy "
            "too); 1: no penalty"
        )
        self.seed_spin = QSpinBox(self)
        self.seed_spin.setRange(0, 2**31 - 1)
        self.seed_spin.setToolTip(
            "Seed of the sampler: the same seed and prompt give the same text"
        )
        layout = QFormLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setVerticalSpacing(2)
        layout.addRow(self.greedy_check)
        layout.addRow("temperature", self.temperature_spin)
        layout.addRow("top-p", self.top_p_spin)
        layout.addRow("top-k", self.top_k_spin)
        layout.addRow("seed", self.seed_spin)
        layout.addRow("repetition penalty", self.repetition_spin)
        self.greedy_check.toggled.connect(self._on_greedy_check_toggled)
        spins = (self.temperature_spin, self.top_p_spin, self.top_k_spin, self.seed_spin)
        for spin in (*spins, self.repetition_spin):
            spin.valueChanged.connect(lambda *_: self.changed.emit())
        self._on_greedy_check_toggled(True)

    def sampling(self) -> Sampling:
        """The settings as the worker's ``Sampling``."""
        return Sampling(
            greedy=self.greedy_check.isChecked(),
            temperature=float(self.temperature_spin.value()),
            top_p=float(self.top_p_spin.value()),
            top_k=int(self.top_k_spin.value()),
            repetition_penalty=float(self.repetition_spin.value()),
            seed=int(self.seed_spin.value()),
        )

    def summary(self) -> str:
        """A short name for the tab: "greedy" or "sampled"."""
        return "greedy" if self.greedy_check.isChecked() else "sampled"

    def _on_greedy_check_toggled(self, greedy: bool) -> None:
        for spin in (self.temperature_spin, self.top_p_spin, self.top_k_spin, self.seed_spin):
            spin.setEnabled(not greedy)
        self.changed.emit()


def _double(
    parent: QWidget, low: float, high: float, step: float, value: float, decimals: int
) -> QDoubleSpinBox:
    spin = QDoubleSpinBox(parent)
    spin.setRange(low, high)
    spin.setSingleStep(step)
    spin.setDecimals(decimals)
    spin.setValue(value)
    return spin
