"""Predicted beside measured memory in the window: a real load of the demo checkpoint in a real
worker fills the Inference tab's Memory table, the lane tooltips and the Log; a run updates it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open

from workbench.gui.commands import push_plan
from workbench.runtime.formatting import format_nbytes
from workbench.runtime.memory_record import TABLE_COLUMNS

pytestmark = [pytest.mark.gui, pytest.mark.slow]

LOAD_TIMEOUT_MS = 180_000  # a cold worker imports torch + transformers; the machine is shared


def _stored_nbytes(folder: Path, device_map: dict[str, Any], device: str) -> int:
    """Bytes the checkpoint stores for the tensors the map places on ``device`` (headers)."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    total = 0
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(folder / shard), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                covering = max(
                    (k for k in device_map if key == k or key.startswith(f"{k}.")), key=len
                )
                if device_map[covering] == device:
                    tensor = handle.get_slice(key)
                    count = 1
                    for size in tensor.get_shape():
                        count *= size
                    total += count * {"F16": 2, "BF16": 2, "F32": 4}[tensor.get_dtype()]
    return total


def test_a_load_fills_the_memory_table_lane_tooltips_and_log(
    stop_resource_tracker: Any,
    main_window: Any,
    open_in_window: Any,
    demo_dir: Path,
    tmp_path: Path,
    qtbot: Any,
) -> None:
    from workbench.big_modeling import infer_auto_device_map

    opened = open_in_window(main_window, demo_dir)
    total = opened.tree.root.nbytes
    plan = infer_auto_device_map(
        opened.model,
        max_memory={"cpu": total // 2, "disk": 100 * total},
        no_split_module_classes=opened.no_split_modules,
    )
    assert {"cpu", "disk"} <= set(plan.values()), plan
    push_plan(main_window.undo_stack, main_window.session, plan, strategy="auto")
    panels = main_window.runtime_panels
    panels.bridge.host.offload_root = tmp_path / "offload"
    panels.controller.error_presenter = lambda *_: None
    view = panels.inference_panel.memory_view
    table = view.table
    assert table.columnCount() == 0

    with qtbot.waitSignal(view.record_shown, timeout=LOAD_TIMEOUT_MS) as shown:
        panels.load_action.trigger()
    record, measured_map = shown.args
    assert record.job == "load" and measured_map == dict(main_window.session.device_map)
    figures = [table.verticalHeaderItem(i).text() for i in range(table.rowCount())]
    assert figures == list(TABLE_COLUMNS[1:])  # a row per figure, a column per device
    columns = {
        table.horizontalHeaderItem(c).text(): {
            figure: table.item(r, c).text() for r, figure in enumerate(figures)
        }
        for c in range(table.columnCount())
    }
    assert set(columns) == {"cpu", "disk"}
    cpu_nbytes = _stored_nbytes(demo_dir, plan, "cpu")  # the GUI loads as stored (fp16)
    assert columns["cpu"]["measured weights"] == format_nbytes(cpu_nbytes)
    assert record.device("cpu").measured_weights_bytes == cpu_nbytes
    assert columns["disk"]["read from disk"] != "-"  # the checkpoint's bytes
    assert columns["cpu"]["error"].endswith("%")
    cpu_column = list(columns).index("cpu")
    assert "anonymous RSS" in table.item(0, cpu_column).toolTip()  # how the CPU was measured

    cpu_lane = main_window.lanes.lane("cpu")
    tip = cpu_lane.bar.toolTip()
    assert (
        "placed on cpu" in tip
        and f"measured after the load: {format_nbytes(cpu_nbytes)} weights" in tip
    )
    assert "memory after load: cpu predicted" in main_window.log_view.toPlainText()

    inference = panels.inference_panel
    inference.max_tokens_spin.setValue(2)
    with qtbot.waitSignal(view.record_shown, timeout=LOAD_TIMEOUT_MS) as shown:
        inference.run_button.click()
    run_record = shown.args[0]
    assert run_record.job == "infer" and run_record.device("disk").read_bytes > 0
    assert "during the last run" in view.caption.text()
    # every figure row shows in the table, the notes below it; a short dock scrolls the two
    # together (4 of 6 rows showed beside notes of fixed height in the first-run window)
    assert not view.notes.isHidden() or not run_record.notes
    assert table.viewport().height() >= table.verticalHeader().length()
    assert table.verticalScrollBar().maximum() == 0
    assert "measured in the last run: " in cpu_lane.bar.toolTip()
    assert "memory after infer" in main_window.log_view.toPlainText()

    with qtbot.waitSignal(view.record_shown, timeout=LOAD_TIMEOUT_MS) as shown:
        panels.unload_action.trigger()
    assert shown.args == [None, None]
    assert "measured" not in cpu_lane.bar.toolTip()  # nothing is loaded: no measured figures
    assert "no longer loaded" in view.caption.text()
    # said first: the caption is cut at the panel's width (found switching models under Xvfb)
    assert view.caption.text().startswith("That model is no longer loaded — ")


def test_a_load_follows_the_sessions_precision_map(
    stop_resource_tracker: Any,
    main_window: Any,
    open_in_window: Any,
    demo_dir: Path,
    tmp_path: Path,
    qtbot: Any,
) -> None:
    """Set precision (the tree's menu, one undo step) makes the load quantize: the cpu weights
    measured after it are fewer than the checkpoint's fp16 bytes (int8 packs a weight into one
    byte plus a scale per row, about half of fp16)."""
    from workbench.gui.precision_column import push_precision

    open_in_window(main_window, demo_dir)
    push_plan(main_window.undo_stack, main_window.session, {"": "cpu"}, strategy="auto")
    layers = sorted(
        name
        for name in json.loads((demo_dir / "model.safetensors.index.json").read_text())[
            "weight_map"
        ]
        if name.startswith("model.layers.0.")
    )
    assert layers, "the demo has a first decoder layer"
    assert push_precision(main_window.undo_stack, main_window.session, ["model.layers.0"], "int8")
    panels = main_window.runtime_panels
    panels.bridge.host.offload_root = tmp_path / "offload"
    panels.controller.error_presenter = lambda *_: None
    view = panels.inference_panel.memory_view
    with qtbot.waitSignal(view.record_shown, timeout=LOAD_TIMEOUT_MS) as shown:
        panels.load_action.trigger()
    record = shown.args[0]
    stored = _stored_nbytes(demo_dir, {"model": "cpu", "lm_head": "cpu"}, "cpu")
    measured = record.device("cpu").measured_weights_bytes
    assert measured is not None and measured < stored, (measured, stored)
    # the prediction counts the int8 layer at the planner's size, exact to the byte;
    # non-persistent buffers (rotary inv_freq) are in neither side
    assert record.device("cpu").predicted_weights_bytes == measured
