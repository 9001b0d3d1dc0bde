"""Device-map files in the GUI: import with validation, atomic export, copy as code.

Import never changes anything until the user accepts a valid map: the file is read with the
engine's ``read_device_map`` (not UTF-8, JSON errors, duplicate keys: an error box naming the
file), then checked against the open model. ``ImportDialog`` lists every problem together:
entries that do not name a device, unknown names, uncovered modules, devices the hardware
profile lacks; its OK button stays disabled while there are any, and accepting pushes one undo
command. Export goes through the engine's atomic ``save_device_map``.

Example:
    >>> dialog = import_device_map(window, "map.json")  # doctest: +SKIP
    >>> dialog.accept()  # applies it as one undo step when it is valid
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QLabel,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from workbench.gui import settings as app_settings
from workbench.gui.commands import SetDeviceMapCommand
from workbench.runtime import (
    BadInputError,
    DeviceMapReading,
    device_label,
    dtype_name,
    load_device_map,
    model_record_differences,
    read_device_map,
    resolve_device_map,
    save_device_map,
)
from workbench.runtime.formatting import format_nbytes
from workbench.runtime.map_code import checkpoint_location, from_pretrained_code
from workbench.runtime.map_edits import MapIndex, compact_names
from workbench.runtime.precision_session import kept_modules, precision_section
from workbench.runtime.quantization_code import quantization_config_code
from workbench.wording import plural

if TYPE_CHECKING:
    from workbench.gui.window_context import WindowContext

logger = logging.getLogger(__name__)


def map_problems(
    window: WindowContext, device_map: dict[str, Any], reading: DeviceMapReading | None = None
) -> list[str]:
    """Return every reason ``device_map`` cannot be used for the open model (sorted lists).

    Args:
        reading: the file ``device_map`` came from; its entries that do not name a device are
            listed first (and count as covering their modules, so they are not also reported
            as uncovered).
    """
    tree = window.session.tree
    if tree is None:
        return ["no model is open: open the model this map belongs to first"]
    problems = []
    coverage = dict(device_map)
    if reading is not None and reading.bad_devices:
        problems.append(reading.bad_devices_message())
        coverage.update(dict.fromkeys(reading.bad_devices, "cpu"))  # for the checks below
    index = MapIndex(tree, coverage)
    unknown = index.unknown_names()
    if unknown:
        problems.append(
            f"{len(unknown)} unknown module name(s), not in {tree.root.class_name}: "
            + ", ".join(unknown[:30])
            + (" …" if len(unknown) > 30 else "")
        )
    uncovered = index.uncovered(limit=200)
    if uncovered:
        problems.append(
            f"{len(uncovered)}{'+' if len(uncovered) == 200 else ''} uncovered module(s) or "
            f"tensor(s) with no device: {', '.join(compact_names(uncovered[:30]))}. "
            "Add covering keys or a '' entry."
        )
    if not problems:
        problems.extend(_engine_check(window, device_map))
    profile = window.hardware_profile()
    if profile is not None:
        missing = sorted(
            {device_label(d) for d in device_map.values() if not profile.has_device(d)}
        )
        if missing:
            have = ", ".join(device_label(s.device) for s in profile.devices)
            problems.append(
                f"device(s) {', '.join(missing)} not in hardware profile {profile.name!r} "
                f"(it has {have}); pick another profile or edit the map"
            )
    return problems


def _engine_check(window: WindowContext, device_map: dict[str, Any]) -> list[str]:
    """The engine's exact coverage check (every tensor covered once, no contradictions)."""
    model = getattr(window.session.opened, "model", None)
    if model is None:
        return []
    try:
        resolve_device_map(model, device_map)  # strict: unknown names are errors
    except BadInputError as exc:
        return [str(exc)]
    return []


class ImportDialog(QDialog):
    """Shows a map file's summary or its problems; OK applies it (disabled while invalid).

    The dialog is window-modal, and a new import closes the one before, so import dialogs
    never pile up and none stays open while the user loads.

    A wrapped map whose ``"model"`` record names another model (class, parameter count) shows
    what differs; OK stays disabled until the user ticks ``use_plain_map`` ("import the plain
    map anyway").

    Attributes:
        problems: the reasons the map cannot be applied (empty when valid).
        record_differences: how the map's model record differs from the open model.
        use_plain_map: the explicit choice to import the map despite those differences.
        device_map: the map read from the file.
    """

    def __init__(
        self,
        window: WindowContext,
        path: Path,
        device_map: dict[str, Any],
        reading: DeviceMapReading | None = None,
    ) -> None:
        super().__init__(window)
        self.setWindowTitle(f"Import device map — {path.name}")
        self.setWindowModality(Qt.WindowModality.WindowModal)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.window_ = window
        self.path = path
        self.device_map = device_map
        self.problems = map_problems(window, device_map, reading)
        self.record_differences = _record_differences(window, reading)
        self.applied = False
        summary = QLabel(self)
        summary.setWordWrap(True)
        details = QPlainTextEdit(self)
        details.setReadOnly(True)
        if self.problems:
            summary.setText(f"<b>{path}</b> cannot be applied to this model; nothing was changed:")
            details.setPlainText("\n\n".join(f"• {p}" for p in self.problems))
        else:
            tree = window.session.tree
            totals = MapIndex(tree, device_map).per_device_bytes() if tree is not None else {}
            summary.setText(
                f"<b>{path}</b>: {plural(len(device_map), 'entry')}, valid for this model. Apply it?"
            )
            details.setPlainText(
                "\n".join(f"{device_label(d)}: {format_nbytes(n)}" for d, n in totals.items())
            )
        if self.record_differences:
            summary.setText(
                f"<b>{path}</b> was made for another model; nothing was changed. What differs:"
            )
            lines = [f"• {difference}" for difference in self.record_differences]
            details.setPlainText("\n".join(lines) + "\n\n" + details.toPlainText())
        self.message = summary.text() + "\n" + details.toPlainText()
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, self
        )
        self.use_plain_map = QCheckBox(
            "Import the plain map anyway (its entries fit this model; the record does not)", self
        )
        self.use_plain_map.setVisible(bool(self.record_differences))
        self.use_plain_map.setEnabled(not self.problems)
        self.use_plain_map.toggled.connect(self._on_use_plain_map_toggled)
        self._on_use_plain_map_toggled(False)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(summary)
        layout.addWidget(details)
        layout.addWidget(self.use_plain_map)
        layout.addWidget(self.buttons)
        self.resize(620, 320)

    def can_apply(self) -> bool:
        """No problems, and a model record that matches or that the user chose to ignore."""
        return not self.problems and (not self.record_differences or self.use_plain_map.isChecked())

    def _on_use_plain_map_toggled(self, _checked: bool) -> None:
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(self.can_apply())

    def accept(self) -> None:
        """Apply the map as one undo step when it can be applied; otherwise do nothing."""
        if not self.can_apply():
            return
        session = self.window_.session
        self.window_.undo_stack.push(
            SetDeviceMapCommand(session, self.device_map, f"Import map from {self.path.name}")
        )
        self.applied = True
        super().accept()


def _record_differences(window: WindowContext, reading: DeviceMapReading | None) -> list[str]:
    """How a wrapped map's model record differs from the open model (the engine's comparison)."""
    tree = window.session.tree
    if reading is None or not reading.model_record or tree is None:
        return []
    opened = window.session.opened
    return model_record_differences(
        reading.model_record,
        class_name=getattr(opened, "model_class", "") or tree.root.class_name,
        param_count=tree.root.param_count,
    )


def read_map_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a device-map file (plain or wrapped) with the engine's reader.

    Raises:
        DeviceMapError: not UTF-8, malformed JSON, duplicate keys, bad devices, wrong version
            (each naming the file).
        FileNotFoundError: when ``path`` does not exist.
    """
    return dict(load_device_map(path))


def import_device_map(window: WindowContext, path: str | os.PathLike[str]) -> ImportDialog | None:
    """Read and validate ``path``; show the import dialog (or the read error).

    Returns:
        The window-modal dialog (accept it to apply; an earlier one still open is closed), or
        ``None`` when the file could not be read.
    """
    target = Path(path)
    try:
        reading = read_device_map(target)
    except (BadInputError, OSError) as exc:
        logger.warning("import of %s refused: %s", target, str(exc))
        window.show_error("Cannot import device map", str(exc))
        return None
    for previous in window.findChildren(ImportDialog):
        if previous.isVisible():
            previous.reject()  # one import at a time: a second file replaces the first
    dialog = ImportDialog(window, target, dict(reading.device_map), reading)
    dialog.open()  # window-modal: the window (Load included) waits for OK or Cancel
    return dialog


def import_dialog(window: WindowContext) -> None:
    path, _ = QFileDialog.getOpenFileName(
        window, "Import device map", str(app_settings.dialog_folder("map")), "Device map (*.json)"
    )
    if path:
        app_settings.remember_dialog_folder("map", path)
        import_device_map(window, path)


def model_fingerprint(window: WindowContext) -> dict[str, Any]:
    """Identify the open model in a wrapped map file (source, class, sizes, module count)."""
    session = window.session
    opened, tree = session.opened, session.tree
    if tree is None:
        return {}
    return {
        "source": session.source,
        "class": getattr(opened, "model_class", "") or tree.root.class_name,
        "param_count": tree.root.param_count,
        "nbytes": tree.root.nbytes,
        "num_modules": len(tree),
        "planning_dtype": dtype_name(tree.planning_dtype),
    }


def export_device_map(
    window: WindowContext, path: str | os.PathLike[str], *, wrapped: bool = False
) -> Path:
    """Write the current map atomically (plain transformers format, or wrapped).

    Raises:
        DeviceMapError: when the engine refuses the map.
        OSError: when the file cannot be written (nothing partial is left).
    """
    target = Path(path)
    metadata: dict[str, Any] = {}
    if wrapped:  # save_device_map puts every keyword under the file's "model" key
        metadata.update(model_fingerprint(window))
        profile = window.hardware_profile()
        if profile is not None:
            metadata["profile"] = profile.to_dict()
    session = window.session
    quantization = (
        precision_section(session.opened, session.precision_map)
        if wrapped and session.precision_map
        else None
    )
    save_device_map(target, dict(session.device_map), quantization=quantization, **metadata)
    logger.info("exported device map to %s", target)
    return target


def export_dialog(window: WindowContext, *, wrapped: bool = False) -> None:
    path, _ = QFileDialog.getSaveFileName(
        window,
        "Export device map",
        str(app_settings.dialog_folder("map") / "device_map.json"),
        "Device map (*.json)",
    )
    if not path:
        return
    app_settings.remember_dialog_folder("map", path)
    try:
        export_device_map(window, path, wrapped=wrapped)
    except (BadInputError, OSError) as exc:
        window.show_error("Cannot export device map", str(exc))
        return
    window.statusBar().showMessage(f"Exported {path}", 5000)


def code_snippet(window: WindowContext) -> str:
    """Return a ``from_pretrained(device_map=..., max_memory=...)`` snippet for the map.

    The runtime's one writer (``map_code``), as ``workbench plan --emit-code`` uses it: every
    budget exact (disk included), the checkpoint located by ``checkpoint_location``, ``torch``
    imported only when the tree counts weights in a planning dtype.
    """
    session = window.session
    opened = session.opened
    location, placeholder = checkpoint_location(session.source, getattr(opened, "folder", None))
    precision_map = dict(getattr(session, "precision_map", None) or {})
    quantization = (
        quantization_config_code(precision_map, kept_modules(opened, precision_map))
        if precision_map and opened is not None
        else None
    )
    return from_pretrained_code(
        model_class=getattr(opened, "model_class", "") or "AutoModelForCausalLM",
        location=location,
        placeholder=placeholder,
        device_map=dict(session.device_map),
        max_memory=dict(session.budgets),
        dtype=getattr(session.tree, "planning_dtype", None),
        quantization=quantization or None,
    )


def copy_as_code(window: WindowContext) -> str:
    """Put the snippet on the clipboard and return it (empty when it cannot be written)."""
    try:
        snippet = code_snippet(window)
    except BadInputError as exc:  # e.g. NF4 mixed with int8: transformers takes one method
        window.show_error("Cannot copy as code", str(exc))
        return ""
    QGuiApplication.clipboard().setText(snippet)
    window.statusBar().showMessage("Copied a from_pretrained(...) snippet to the clipboard", 5000)
    return snippet


def save_session_dialog(window: WindowContext, parent: QWidget | None = None) -> None:
    source = window.session.source or "session"  # the model's name: config.json says nothing
    base = Path(source).parent if Path(source).name == "config.json" else Path(source)
    name = base.name.removesuffix(".gguf")
    path, _ = QFileDialog.getSaveFileName(
        parent or window,
        "Save session",
        # the suffix file managers know (resources/*.mime.xml)
        str(app_settings.dialog_folder("session") / f"{name or 'session'}.wbsession.json"),
        "Workbench session (*.wbsession.json *.json)",
    )
    if not path:
        return
    app_settings.remember_dialog_folder("session", path)
    try:
        window.session.save(path)
    except (OSError, TypeError, ValueError) as exc:
        window.show_error("Cannot save the session", str(exc))
