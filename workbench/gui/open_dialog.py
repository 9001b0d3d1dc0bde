"""The "Open config or folder" dialog: one dialog that picks a config file *or* a model folder.

Qt's file dialogs pick either files or folders. ``OpenModelDialog`` is Qt's own (non-native)
file dialog with one more button, "Open folder <name>", which opens the folder the dialog
shows: double-click into the model folder, then press it. Open, as usual, opens the selected
file (a ``config.json``, a saved session or a GGUF file).

Example:
    >>> dialog = OpenModelDialog(window)  # doctest: +SKIP
    >>> dialog.chosen.connect(window.open_replacing)
    >>> dialog.open()
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialogButtonBox,
    QFileDialog,
    QFileSystemModel,
    QPushButton,
    QWidget,
)

NAME_FILTERS = (
    "Model config, session or GGUF (*.json *.gguf)",
    "All files (*)",
)
_MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json")


def is_model_folder(folder: Path) -> bool:
    """True for a folder the workbench opens as a model (config, safetensors or GGUF inside)."""
    if not folder.is_dir():
        return False
    if any((folder / name).is_file() for name in _MODEL_FILES):
        return True
    try:
        return any(path.suffix in (".safetensors", ".gguf") for path in folder.iterdir())
    except OSError:
        return False


class OpenModelDialog(QFileDialog):
    """Pick a ``config.json`` (or session / GGUF file) with Open, or the folder shown with
    "Open folder".

    Signals:
        chosen(str): the file or folder the user opened.

    Attributes:
        folder_button: the "Open folder <name>" button (bold when the folder holds a model).
        chosen_path: the last choice, or ``None``.
    """

    chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None, directory: str = "") -> None:
        super().__init__(parent, "Open config.json, GGUF file or model folder", directory)
        self.setObjectName("openModelDialog")
        self.setOption(QFileDialog.Option.DontUseNativeDialog, True)  # a native one: files only
        self.setFileMode(QFileDialog.FileMode.ExistingFile)
        self.setAcceptMode(QFileDialog.AcceptMode.AcceptOpen)
        self.setNameFilters(list(NAME_FILTERS))
        self.chosen_path: Path | None = None
        self.folder_button = QPushButton(self)
        self.folder_button.setObjectName("openFolderButton")
        self.folder_button.setToolTip("Open the folder shown here as a model folder")
        box = self.findChild(QDialogButtonBox)
        if box is not None:
            box.addButton(self.folder_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.folder_button.clicked.connect(self._on_folder_button_clicked)
        self.directoryEntered.connect(lambda _path: self._update_folder_button())
        files = self.findChild(QFileSystemModel)  # its root follows every way of moving
        if files is not None:
            files.rootPathChanged.connect(lambda _path: self._update_folder_button())
        self._update_folder_button()

    @property
    def shown_folder(self) -> Path:
        return Path(self.directory().absolutePath())

    def accept(self) -> None:
        selected = [Path(name) for name in self.selectedFiles() if name]
        if len(selected) == 1 and selected[0].is_file():
            self._choose(selected[0])
        else:
            super().accept()  # Qt enters a folder or says the file does not exist

    def _on_folder_button_clicked(self) -> None:
        self._choose(self.shown_folder)

    def _choose(self, path: Path) -> None:
        self.chosen_path = path
        self.done(QFileDialog.DialogCode.Accepted)
        self.chosen.emit(str(path))

    def _update_folder_button(self) -> None:
        folder = self.shown_folder
        self.folder_button.setText(f"Open folder “{folder.name or folder}”")
        font = self.folder_button.font()
        font.setBold(is_model_folder(folder))  # the likely choice stands out
        self.folder_button.setFont(font)


def open_model_dialog(parent: QWidget, directory: str = "") -> OpenModelDialog:
    """Show an ``OpenModelDialog`` window-modally (without blocking) and return it."""
    dialog = OpenModelDialog(parent, directory)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)  # one per click: none piles up
    dialog.open()
    return dialog
