"""Pick the hardware to plan for (detected or a what-if profile) and edit budgets per device.

``HardwareSelector`` is the toolbar combo; ``BudgetEditor`` is a small table with one spin box
per device (GiB). Neither edits the session: they emit signals the window turns into commands.

Example:
    >>> selector = HardwareSelector()  # doctest: +SKIP
    >>> selector.profile_chosen.connect(window.set_hardware_profile)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QWidget,
)

from workbench.gui.colors import device_color
from workbench.models.hardware import detect_hardware, list_profiles
from workbench.runtime import device_label

logger = logging.getLogger(__name__)

GIB = 1024**3
DETECTED = "detected"


def available_profiles() -> list[Any]:
    """Return the detected hardware first, then every what-if profile (bundled and user)."""
    profiles: list[Any] = []
    try:
        profiles.append(detect_hardware())
    except Exception:  # detection must never keep the window from opening
        logger.warning("hardware detection failed", exc_info=True)
    try:
        profiles.extend(p for p in list_profiles() if p.name != DETECTED)
    except Exception:
        logger.warning("listing hardware profiles failed", exc_info=True)
    return profiles


class HardwareSelector(QComboBox):
    """Combo of hardware profiles; emits ``profile_chosen(profile)`` when the user picks one."""

    profile_chosen = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setToolTip("Hardware to plan for: this machine, or a what-if profile")
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.setAccessibleName("Hardware profile")
        self._profiles: list[Any] = []
        self.currentIndexChanged.connect(self._on_combo_index_changed)

    def set_profiles(self, profiles: list[Any], current_name: str | None = None) -> None:
        """Fill the combo; select ``current_name`` when present (no signal)."""
        with QSignalBlocker(self):
            self.clear()
            self._profiles = list(profiles)
            for profile in self._profiles:
                label = "This machine (detected)" if profile.name == DETECTED else profile.name
                self.addItem(label, profile.name)
                budgets = profile.budget_description()
                tip = profile.description  # the detected one's says how its budgets are made
                tip += "" if budgets in tip else f"\n{budgets}"
                self.setItemData(self.count() - 1, tip, Qt.ItemDataRole.ToolTipRole)
            if current_name is not None:
                self.select_name(current_name)

    def select_name(self, name: str) -> bool:
        """Select the profile called ``name`` without emitting; return whether it exists."""
        position = self.findData(name)
        if position < 0:
            return False
        with QSignalBlocker(self):
            self.setCurrentIndex(position)
        return True

    def add_profile(self, profile: Any) -> None:
        """Add (or replace) a profile, e.g. one restored from a session, and select it."""
        names = [p.name for p in self._profiles]
        if profile.name in names:
            self._profiles[names.index(profile.name)] = profile
        else:
            self._profiles.append(profile)
        self.set_profiles(self._profiles, profile.name)

    def update_profile(self, profile: Any) -> None:
        """Swap the listed profile of ``profile``'s name for ``profile`` (the same hardware,
        newly measured figures); nothing is selected or emitted."""
        names = [p.name for p in self._profiles]
        if profile.name in names:
            self._profiles[names.index(profile.name)] = profile

    def profile(self, name: str) -> Any | None:
        """Return the profile called ``name`` or ``None``."""
        return next((p for p in self._profiles if p.name == name), None)

    def current_profile(self) -> Any | None:
        position = self.currentIndex()
        return self._profiles[position] if 0 <= position < len(self._profiles) else None

    def _on_combo_index_changed(self, position: int) -> None:
        if 0 <= position < len(self._profiles):
            self.profile_chosen.emit(self._profiles[position])


class BudgetEditor(QWidget):
    """One spin box (GiB) per device of the profile; emits ``budgets_edited(dict)`` on edits."""

    budgets_edited = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._layout = QFormLayout(self)
        self._layout.setContentsMargins(6, 6, 6, 6)
        self.spin_boxes: dict[int | str, QDoubleSpinBox] = {}
        self._bytes: dict[int | str, int] = {}

    def set_budgets(
        self, budgets: Mapping[int | str, int], names: Mapping[int | str, str] | None = None
    ) -> None:
        """Show ``budgets`` (bytes) without emitting; rebuilds rows when the devices change."""
        names = names or {}
        if list(self.spin_boxes) != list(budgets):
            while self._layout.rowCount():
                self._layout.removeRow(0)
            self.spin_boxes = {}
            for device in budgets:
                spin = QDoubleSpinBox(self)
                spin.setRange(0.0, 1024.0 * 1024)
                spin.setDecimals(1)
                spin.setSuffix(" GiB")
                spin.setKeyboardTracking(False)
                spin.setAccessibleName(f"Budget for {device_label(device)}")
                spin.valueChanged.connect(
                    lambda value, device=device: self._on_spin_value_changed(device, value)
                )
                label = QLabel(
                    f"<span style='color:{device_color(device).name()}'>■</span> "
                    f"{device_label(device)}",
                    self,
                )
                label.setToolTip(names.get(device, ""))
                label.setBuddy(spin)
                self._layout.addRow(label, spin)
                self.spin_boxes[device] = spin
        self._bytes = {device: int(nbytes) for device, nbytes in budgets.items()}
        for device, nbytes in budgets.items():
            spin = self.spin_boxes[device]
            with QSignalBlocker(spin):
                spin.setValue(nbytes / GIB)

    def budgets(self) -> dict[int | str, int]:
        """Return the budgets shown, in bytes (exact for the devices not edited)."""
        return dict(self._bytes)

    def _on_spin_value_changed(self, device: int | str, value_gib: float) -> None:
        self._bytes[device] = round(value_gib * GIB)
        self.budgets_edited.emit(self.budgets())
