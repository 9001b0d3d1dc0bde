"""A small, non-modal browser of the local Hugging Face cache (offline, no network)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QVBoxLayout,
    QWidget,
)

from workbench.models.hf_cache import list_cached_models
from workbench.runtime.formatting import format_nbytes


class CacheBrowser(QDialog):
    """Lists cached model repositories; emits ``chosen("hf-cache:REPO")`` on Open/double-click."""

    chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None, cache_dir: str | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Hugging Face cache")
        self.setModal(False)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.list_widget = QListWidget(self)
        self.list_widget.itemActivated.connect(self._on_list_item_activated)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Open | QDialogButtonBox.StandardButton.Close, self
        )
        buttons.accepted.connect(self._on_buttons_accepted)
        buttons.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        self.info_label = QLabel(self)
        layout.addWidget(self.info_label)
        layout.addWidget(self.list_widget)
        layout.addWidget(buttons)
        self._fill(cache_dir)

    def _fill(self, cache_dir: str | None) -> None:
        try:
            models = list_cached_models(cache_dir)
        except Exception as exc:  # a broken cache must not take the window down
            self.info_label.setText(f"Cannot read the cache: {exc}")
            return
        usable = [m for m in models if m.has_config]
        self.info_label.setText(
            f"{len(usable)} model(s) with a config.json in the local cache"
            if usable
            else "No cached models with a config.json (nothing is downloaded from here)."
        )
        for model in usable:
            weights = "weights" if model.has_weights else "config only"
            item = QListWidgetItem(
                f"{model.repo_id}  ({format_nbytes(model.size_on_disk)}, {weights})"
            )
            item.setData(Qt.ItemDataRole.UserRole, model.repo_id)
            self.list_widget.addItem(item)

    def _on_list_item_activated(self, item: QListWidgetItem) -> None:
        self.chosen.emit(f"hf-cache:{item.data(Qt.ItemDataRole.UserRole)}")
        self.close()

    def _on_buttons_accepted(self) -> None:
        item = self.list_widget.currentItem()
        if item is not None:
            self._on_list_item_activated(item)
