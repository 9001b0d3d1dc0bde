"""The planner's reserve controls: the memory model's options, or a fixed number of bytes.

With "memory model" each device keeps free the KV cache of the layers it runs plus their
activation peak, for ``batch`` sequences of ``context`` tokens (at its minimum the spin box
means the model's ``max_position_embeddings`` capped by ``cap``), a KV dtype, for MLA models an
engine, and the tokens of one prefill forward (``prefill``; at its minimum the whole context,
else an engine's chunk size) (``runtime.planning.MemoryOptions``). With "bytes" the execution
device keeps a fixed reserve. The controls are remembered in ``QSettings``
(``settings.planner_memory``); ``changed`` fires on every edit; ``set_memory_options`` shows a
restored session's options. A note line under the controls names the context (and prefill
chunk) planned for, or the config keys the memory model did not understand (those layers count
as dense).

Example:
    >>> controls = ReserveControls()  # doctest: +SKIP
    >>> controls.memory_options()  # doctest: +SKIP
    MemoryOptions(batch=1, context=None, kv_dtype='model', engine='transformers', ...,
    prefill_tokens=None)
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QDoubleSpinBox,
    QGridLayout,
    QLabel,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from workbench.gui.colors import warning_color
from workbench.gui.settings import planner_memory, save_planner_memory
from workbench.runtime.planning import (
    DEFAULT_CONTEXT_CAP,
    KV_DTYPES,
    KV_ENGINES,
    MemoryOptions,
    attention_layout,
    planned_context,
    planned_prefill,
)

GIB = 1024**3
MAX_CONTEXT = 16 * 1_048_576
MEMORY_DEFAULTS = {
    "reserve_mode": "model",
    "batch": 1,
    "context": 0,  # 0: the model's maximum, capped
    "context_cap": DEFAULT_CONTEXT_CAP,
    "kv_dtype": "model",
    "kv_engine": "transformers",
    "prefill_tokens": 0,  # 0: the whole context in one forward
}


class ReserveControls(QWidget):
    """Memory model (batch, context, cap, KV dtype, engine, prefill) or bytes; ``changed`` on
    edits."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.by_model = QRadioButton("memory model", self)
        self.by_model.setToolTip(
            "Each device keeps free the KV cache of the layers it runs plus their activation "
            "peak (a prefill of the whole context, or of one chunk); the lanes show the same "
            "figures"
        )
        self.by_bytes = QRadioButton("bytes", self)
        self.by_bytes.setToolTip("A fixed reserve on the execution device")
        self.by_model.setChecked(True)
        group = QButtonGroup(self)
        group.addButton(self.by_model)
        group.addButton(self.by_bytes)
        self.batch_spin = _spin(self, 1, 1024, 1, "batch ")
        self.context_spin = _spin(self, 0, MAX_CONTEXT, 0, "context ")
        self.context_spin.setSpecialValueText("model max")
        self.context_spin.setSingleStep(1024)
        self.context_spin.setToolTip(
            "Tokens the KV cache holds; at the minimum: the model's max_position_embeddings, "
            "at most the cap"
        )
        self.context_cap_spin = _spin(self, 1, MAX_CONTEXT, DEFAULT_CONTEXT_CAP, "cap ")
        self.context_cap_spin.setSingleStep(1024)
        self.context_cap_spin.setToolTip("The most context 'model max' plans for")
        self.prefill_spin = _spin(self, 0, MAX_CONTEXT, 0, "prefill ")
        self.prefill_spin.setSpecialValueText("prefill = context")
        self.prefill_spin.setSingleStep(512)
        self.prefill_spin.setToolTip(
            "Tokens one prefill forward processes, which sets the activation peak; at the "
            "minimum: the whole context (transformers' generate). Engines that prefill in "
            "chunks peak at their chunk size: vLLM's max_num_batched_tokens, llama.cpp's "
            "ubatch (512-8192)"
        )
        self.kv_dtype_combo = QComboBox(self)
        for dtype in KV_DTYPES:
            self.kv_dtype_combo.addItem(f"KV {dtype}", dtype)
        self.kv_dtype_combo.setToolTip("KV cache dtype ('model': the dtype activations run in)")
        self.kv_engine_combo = QComboBox(self)
        for engine in KV_ENGINES:
            self.kv_engine_combo.addItem(f"MLA {engine}", engine)
        self.kv_engine_combo.setToolTip(
            "Whose MLA cache to count (DeepSeek V2/V3): transformers, vLLM and SGLang cache the "
            "compressed latent, transformers 4.x the expanded heads; no effect on other models"
        )
        self.reserve_gib = QDoubleSpinBox(self)
        self.reserve_gib.setRange(0, 4096)
        self.reserve_gib.setSuffix(" GiB")
        self.note = QLabel(self)
        self.note.setObjectName("plannerMemoryNote")
        self.note.setWordWrap(True)
        self.note.setVisible(False)
        self._build_layout()
        self._restore()
        for spin in (self.batch_spin, self.context_spin, self.context_cap_spin, self.prefill_spin):
            spin.valueChanged.connect(self._on_control_changed)
        for combo in (self.kv_dtype_combo, self.kv_engine_combo):
            combo.currentTextChanged.connect(self._on_control_changed)
        self.by_model.toggled.connect(self._on_control_changed)
        self.reserve_gib.valueChanged.connect(self._on_control_changed)

    def _build_layout(self) -> None:
        # narrow: the planner dock sits beside the tree and the lanes (a third of a 1440 px
        # window); the memory model's fields sit under its button, two to a row
        grid = QGridLayout()
        grid.setContentsMargins(0, 0, 0, 0)
        grid.addWidget(self.by_model, 0, 0, 1, 2)
        grid.addWidget(self.batch_spin, 1, 0)
        grid.addWidget(self.context_spin, 1, 1)
        grid.addWidget(self.kv_dtype_combo, 2, 0)
        grid.addWidget(self.context_cap_spin, 2, 1)
        grid.addWidget(self.kv_engine_combo, 3, 0)
        grid.addWidget(self.prefill_spin, 3, 1)  # the token counts share a column
        grid.addWidget(self.by_bytes, 4, 0)
        grid.addWidget(self.reserve_gib, 4, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addLayout(grid)
        layout.addWidget(self.note)

    def _restore(self) -> None:
        saved = planner_memory(MEMORY_DEFAULTS)
        self.by_bytes.setChecked(saved["reserve_mode"] == "bytes")
        self.by_model.setChecked(saved["reserve_mode"] != "bytes")
        self.batch_spin.setValue(saved["batch"])
        self.context_spin.setValue(saved["context"])
        self.context_cap_spin.setValue(saved["context_cap"])
        self.prefill_spin.setValue(saved["prefill_tokens"])
        self.set_kv_dtype(saved["kv_dtype"])
        self.set_kv_engine(saved["kv_engine"])

    def set_memory_options(self, options: MemoryOptions | None) -> None:
        """Show ``options`` (a restored session's; ``None``: the "bytes" row), remember them
        and fire ``changed`` once."""
        controls = (
            self.by_model,
            self.batch_spin,
            self.context_spin,
            self.context_cap_spin,
            self.prefill_spin,
            self.kv_dtype_combo,
            self.kv_engine_combo,
        )
        for control in controls:
            control.blockSignals(True)
        try:
            self.by_model.setChecked(options is not None)
            self.by_bytes.setChecked(options is None)
            if options is not None:
                self.batch_spin.setValue(options.batch)
                self.context_spin.setValue(options.context or 0)
                self.context_cap_spin.setValue(options.context_cap)
                self.prefill_spin.setValue(options.prefill_tokens or 0)
                self.set_kv_dtype(options.kv_dtype)
                self.set_kv_engine(options.engine)
        finally:
            for control in controls:
                control.blockSignals(False)
        self._on_control_changed()

    def set_kv_dtype(self, dtype: str) -> None:
        """Choose a KV dtype of ``KV_DTYPES`` (an unknown one is ignored)."""
        index = self.kv_dtype_combo.findData(dtype)
        if index >= 0:
            self.kv_dtype_combo.setCurrentIndex(index)

    def set_kv_engine(self, engine: str) -> None:
        """Choose an engine of ``KV_ENGINES`` (an unknown one is ignored)."""
        index = self.kv_engine_combo.findData(engine)
        if index >= 0:
            self.kv_engine_combo.setCurrentIndex(index)

    def _on_control_changed(self, *_args: object) -> None:
        save_planner_memory(
            {
                "reserve_mode": "model" if self.by_model.isChecked() else "bytes",
                "batch": self.batch_spin.value(),
                "context": self.context_spin.value(),
                "context_cap": self.context_cap_spin.value(),
                "kv_dtype": self.kv_dtype_combo.currentData(),
                "kv_engine": self.kv_engine_combo.currentData(),
                "prefill_tokens": self.prefill_spin.value(),
            }
        )
        self.changed.emit()

    def memory_options(self) -> MemoryOptions | None:
        """The memory model's options (``None`` with a fixed reserve in bytes)."""
        if not self.by_model.isChecked():
            return None
        return MemoryOptions(
            batch=self.batch_spin.value(),
            context=self.context_spin.value() or None,
            kv_dtype=self.kv_dtype_combo.currentData(),
            engine=self.kv_engine_combo.currentData(),
            context_cap=self.context_cap_spin.value(),
            prefill_tokens=self.prefill_spin.value() or None,
        )

    def fixed_bytes(self) -> int:
        """The fixed reserve the "bytes" row gives."""
        return round(self.reserve_gib.value() * GIB)

    def update_note(self, opened: Any) -> None:
        """Say which context (and prefill chunk) the memory model plans for ``opened``, or warn
        about config keys it did not understand (those layers count as dense attention) or a
        config it cannot read at all."""
        options = self.memory_options()
        text, warned = "", False
        if opened is not None and options is not None:
            try:
                layout = attention_layout(opened)
                context = planned_context(opened, options)
                prefill = planned_prefill(opened, options)
            except (ValueError, TypeError, AttributeError) as exc:
                text, warned = f"No memory model for this model: {exc}", True
            else:
                chunks = f"prefill in {prefill:,}-token chunks" if prefill < context else ""
                if layout.warnings:
                    text, warned = "Memory model: " + " ".join(layout.warnings), True
                elif options.context is None or chunks:
                    text = f"Planning for {context:,} tokens of context"
                    text += f", {chunks}" if chunks else ""
        self.note.setText(text)
        self.note.setStyleSheet(f"color: {warning_color().name()};" if warned else "")
        self.note.setProperty("warned", warned)
        self.note.setVisible(bool(text))


def _spin(parent: QWidget, low: int, high: int, value: int, prefix: str) -> QSpinBox:
    spin = QSpinBox(parent)
    spin.setRange(low, high)
    spin.setValue(value)
    spin.setPrefix(prefix)
    return spin
