"""The load bar against the real worker: busy while the model is built (no bytes to count),
then the share of the checkpoint's bytes read, while the load is parked half-way; while it
quantizes, the weight bytes quantized, and Cancel stops the load there (the next load works)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from job_holds import HOLD_OBSERVER, hold_options

from workbench.gui.bridge import WorkerBridge

pytestmark = [pytest.mark.gui, pytest.mark.slow]

LOAD_TIMEOUT_MS = 180_000  # a cold worker imports torch + transformers (+ torchao); shared cores
LINEARS_PER_LAYER = 7


@pytest.fixture
def worker_bridge() -> WorkerBridge:
    return WorkerBridge(load_observer=HOLD_OBSERVER)


def test_the_bar_is_busy_while_building_then_counts_the_bytes_read(
    stop_resource_tracker: Any,
    main_window: Any,
    open_in_window: Any,
    demo_dir: Path,
    tmp_path: Path,
    qtbot: Any,
) -> None:
    from workbench.big_modeling import infer_auto_device_map
    from workbench.gui.commands import push_plan

    opened = open_in_window(main_window, demo_dir)
    total = opened.tree.root.nbytes
    plan = infer_auto_device_map(  # cpu + disk, as users of a big model have it
        opened.model,
        max_memory={"cpu": total // 2, "disk": 100 * total},
        no_split_module_classes=opened.no_split_modules,
    )
    push_plan(main_window.undo_stack, main_window.session, plan, strategy="auto")
    panels = main_window.runtime_panels
    panels.bridge.host.offload_root = tmp_path / "offload"
    panels.controller.error_presenter = lambda *_: None
    bar = panels.progress_widget.bar
    seen: dict[str, tuple[int, int]] = {}  # phase -> (bar maximum, bar value) once shown
    panels.bridge.phase.connect(lambda ev: seen.setdefault(ev.phase, (bar.maximum(), bar.value())))
    shown: list[tuple[Any, int, int, str]] = []  # (progress, bar maximum, value, text) as shown
    panels.bridge.progress.connect(
        lambda ev: shown.append((ev, bar.maximum(), bar.value(), bar.format()))
    )
    panels.controller.load_options = hold_options(2)  # park after 2 tensors
    with qtbot.waitSignal(
        panels.bridge.phase, check_params_cb=lambda ev: ev.phase == "held", timeout=LOAD_TIMEOUT_MS
    ):
        panels.load_action.trigger()
    try:
        assert seen["building"][0] == 0  # busy while the empty model is built, not "0%"
        last, maximum, value, text = shown[-1]  # the bytes read when the load was parked
        assert last.phase == "loading" and 0 < last.bytes_done < last.bytes_total
        assert maximum == 1000 and 0 < value < 1000
        assert value == round(last.bytes_done / last.bytes_total * 1000)
        assert text == f"{last.bytes_done / last.bytes_total:.0%}"
    finally:  # a failed check must not leave the worker parked
        with qtbot.waitSignal(panels.controller.busy_changed, timeout=LOAD_TIMEOUT_MS):
            panels.progress_widget.cancel_button.click()
        assert not panels.controller.busy and not panels.controller.loaded


def test_the_bar_follows_quantizing_and_cancel_stops_it(
    stop_resource_tracker: Any,
    main_window: Any,
    open_in_window: Any,
    demo_dir: Path,
    tmp_path: Path,
    qtbot: Any,
) -> None:
    open_in_window(main_window, demo_dir)
    session = main_window.session
    layers = json.loads((demo_dir / "config.json").read_text())["num_hidden_layers"]
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu"}
    device_map.update({f"model.layers.{i}": "disk" for i in range(1, layers)})
    device_map.update({"model.norm": "cpu", "lm_head": "cpu"})
    session.set_device_map(device_map)
    session.set_precision_map({"model.layers": "int8"})
    panels = main_window.runtime_panels
    panels.bridge.host.offload_root = tmp_path / "offload"
    panels.controller.error_presenter = lambda *_: None
    bar = panels.progress_widget.bar
    label = panels.progress_widget.label
    shown: list[tuple[Any, int, int, str]] = []  # (progress, bar maximum, value, label) as shown
    panels.bridge.progress.connect(
        lambda ev: shown.append((ev, bar.maximum(), bar.value(), label.text()))
    )
    tensors = len(json.loads((demo_dir / "model.safetensors.index.json").read_text())["weight_map"])
    panels.controller.load_options = hold_options(tensors + LINEARS_PER_LAYER + 2)
    with qtbot.waitSignal(
        panels.bridge.phase, check_params_cb=lambda ev: ev.phase == "held", timeout=LOAD_TIMEOUT_MS
    ):
        panels.load_action.trigger()
    try:
        quantizing = [item for item in shown if item[0].phase == "quantizing"]
        assert quantizing, [ev.phase for ev, *_ in shown]
        last, maximum, value, text = quantizing[-1]
        assert 0 < last.bytes_done < last.bytes_total
        assert maximum == 1000 and value == round(last.bytes_done / last.bytes_total * 1000)
        assert text.startswith("quantizing") and "k_proj" in text, text
        assert panels.progress_widget.cancel_button.isEnabled()
    finally:  # a failed check must not leave the worker parked
        with qtbot.waitSignal(panels.controller.busy_changed, timeout=LOAD_TIMEOUT_MS):
            panels.progress_widget.cancel_button.click()
    assert not panels.controller.busy and not panels.controller.loaded
    assert panels.progress_widget.label.text() == "load cancelled"

    panels.controller.load_options = {}
    with qtbot.waitSignal(panels.controller.busy_changed, timeout=LOAD_TIMEOUT_MS):
        panels.load_action.trigger()
    qtbot.waitUntil(lambda: not panels.controller.busy, timeout=LOAD_TIMEOUT_MS)
    assert panels.controller.loaded
