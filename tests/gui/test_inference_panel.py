"""The inference panel and run history, driven by a scripted host whose answers come from a
background thread (the real worker runs in test_load_flow.py)."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from PySide6.QtCore import QItemSelectionModel

from workbench.gui.bridge import WorkerBridge
from workbench.gui.inference_panel import InferencePanel
from workbench.gui.run_history import map_diff, map_digest, map_summary
from workbench.runtime.protocol import (
    Failed,
    InferenceResult,
    LayerTiming,
    Result,
    TokenStreamed,
    VerifyResult,
)

pytestmark = pytest.mark.gui


class ScriptedHost:
    def __init__(self, on_event: Callable[[Any], None]) -> None:
        self.on_event = on_event
        self.state = "loaded"
        self.requests: list[tuple] = []

    def play(self, *events: Any) -> None:
        thread = threading.Thread(target=lambda: [self.on_event(e) for e in events])
        thread.start()
        thread.join()

    def start(self) -> None:
        pass

    def infer(self, prompt=None, **kwargs) -> int:
        self.requests.append(("infer", prompt, kwargs))
        return len(self.requests)

    def verify(self, prompt=None, **kwargs) -> int:
        self.requests.append(("verify", prompt, kwargs))
        return len(self.requests)

    def cancel(self) -> bool:
        self.requests.append(("cancel",))
        return True

    def shutdown(self, timeout_s: float = 5.0) -> None:
        pass


MAP_A = {"embed": "cpu", "layers.0": "cpu", "layers.1": "disk"}
MAP_B = {"embed": "cpu", "layers.0": "disk", "layers.1": "disk"}


@pytest.fixture
def panel(qtbot):
    bridge = WorkerBridge(host_factory=ScriptedHost)
    bridge.start()
    state = {"map": dict(MAP_A)}
    panel = InferencePanel(bridge, lambda: state["map"])
    panel.state = state  # type: ignore[attr-defined]
    qtbot.addWidget(panel)
    panel.set_available(True)
    yield panel
    bridge.shutdown()


def _result(request_id: int, tokens_per_s: float = 12.5) -> Result:
    layers = (
        LayerTiming("embed", 0.0, 0.001, 0, ""),
        LayerTiming("layers.0", 0.002, 0.003, 2 * 2**20, "cpu", "cpu"),
        LayerTiming("layers.0.attn", 0.0, 0.001, 0, ""),
        LayerTiming("layers.1", 0.01, 0.003, 4 * 2**20, "disk", "cpu"),
    )
    value = InferenceResult(
        text=" jumps over",
        prompt_tokens=5,
        new_tokens=3,
        ttft_s=0.25,
        tokens_per_s=tokens_per_s,
        total_s=0.5,
        per_layer=layers,
        predicted={"tokens_per_s": 10.0, "ttft_s": 0.2},
    )
    return Result(request_id, "infer", value)


def test_run_streams_tokens_then_shows_figures_and_layers(qtbot, panel) -> None:
    panel.units = ["embed", "layers.0", "layers.1"]
    panel.prompt_edit.setPlainText("The quick brown fox")
    panel.max_tokens_spin.setValue(3)
    panel.run_button.click()
    host = panel.bridge.host
    assert host.requests == [("infer", "The quick brown fox", {"max_new_tokens": 3})]
    assert not panel.run_button.isEnabled() and panel.stop_button.isEnabled()
    tokens = [
        TokenStreamed(1, i, 100 + i, text, 0.25 + i * 0.1)
        for i, text in enumerate([" jumps", " over", ""])
    ]
    with qtbot.waitSignal(panel.bridge.token, timeout=5000):
        host.play(*tokens[:2])
    assert panel.output_edit.toPlainText() == " jumps over"
    assert panel.ttft_label.text() == "250 ms" and panel.tokens_label.text() == "2"
    with qtbot.waitSignal(panel.run_finished, timeout=5000) as finished:
        host.play(tokens[2], _result(1))
    record = finished.args[0]
    assert record.status == "done" and record.device_map == MAP_A and record.new_tokens == 3
    assert panel.rate_label.text() == "12.5 tok/s (predicted 10 tok/s)"
    assert panel.ttft_label.text() == "250 ms (predicted 200 ms)"
    # layers.0.attn folds into its unit layers.0: 3 rows, compute of layers.0 counted once
    assert panel.layer_table.rowCount() == 3
    assert [panel.layer_table.item(r, 1).text() for r in range(3)] == [
        "embed",
        "layers.0",
        "layers.1",
    ]
    assert (
        panel.layer_table.item(2, 2).text() == "disk"
        and panel.layer_table.item(2, 3).text() == "4.0"
    )
    assert panel.layer_table.item(1, 5).text() == "3.00"
    assert panel.run_button.isEnabled()


def test_verify_shows_a_clear_pass_or_fail(qtbot, panel) -> None:
    host = panel.bridge.host
    panel.verify_button.click()
    assert host.requests[-1][0] == "verify"
    passed = VerifyResult(True, 0.0, 0.0, True, "undispatched cpu", (1, 5, 32))
    with qtbot.waitSignal(panel.run_finished, timeout=5000):
        host.play(Result(1, "verify", passed))
    assert "PASS" in panel.verify_label.text() and "bitwise identical" in panel.verify_label.text()
    panel.verify_button.click()
    failed = VerifyResult(False, 0.5, 0.25, False, "undispatched cpu", (1, 5, 32))
    with qtbot.waitSignal(panel.run_finished, timeout=5000):
        host.play(Result(2, "verify", failed))
    text = panel.verify_label.text()
    assert "FAIL" in text and "0.5" in text and "0.25" in text and "#b91c1c" in text


def test_failed_and_stopped_runs_are_recorded(qtbot, panel) -> None:
    host = panel.bridge.host
    panel.run_button.click()
    panel.stop_button.click()
    assert host.requests[-1] == ("cancel",)
    with qtbot.waitSignal(panel.bridge.failed, timeout=5000):
        host.play(Failed(1, "infer cancelled: by the user", kind="cancelled", job="infer"))
    assert panel.history.model.records[0].status == "cancelled"
    assert "cancelled" in panel.status_label.text() and panel.run_button.isEnabled()


def test_history_compares_maps_and_exports_json(qtbot, panel, tmp_path) -> None:
    host = panel.bridge.host
    panel.run_button.click()
    with qtbot.waitSignal(panel.run_finished, timeout=5000):
        host.play(_result(1, tokens_per_s=10.0))
    panel.state["map"] = dict(MAP_B)  # the user reloaded with another map
    panel.run_button.click()
    with qtbot.waitSignal(panel.run_finished, timeout=5000):
        host.play(_result(2, tokens_per_s=5.0))
    history = panel.history
    assert history.model.rowCount() == 2
    assert history.model.index(1, 2).data() == f"{map_digest(MAP_B)} (cpu 1 · disk 2)"
    selection = history.view.selectionModel()
    flags = QItemSelectionModel.SelectionFlag.Select | QItemSelectionModel.SelectionFlag.Rows
    selection.select(history.model.index(0, 0), flags)
    assert "layers.1: disk" in history.details.toPlainText()  # one run: its map
    selection.select(history.model.index(1, 0), flags)
    details = history.details.toPlainText()
    assert "layers.0: cpu -> disk" in details and "0.50x" in details
    history.path_chooser = lambda *_: str(tmp_path / "runs.json")
    history.export_button.click()
    data = json.loads((tmp_path / "runs.json").read_text())
    assert data["format"] == "workbench-run-history"
    assert [run["device_map"] for run in data["runs"]] == [MAP_A, MAP_B]
    assert data["runs"][1]["map_id"] == map_digest(MAP_B) and data["runs"][1]["tokens_per_s"] == 5.0
    target = tmp_path / "no-such-folder" / "runs.json"
    history.path_chooser = lambda *_: str(target)
    history.export_button.click()  # the write fails: a message box says so, nothing is written
    box = history.last_error_box
    assert box is not None and box.isVisible() and not box.isModal()
    assert str(target) in box.text() and not target.parent.exists()


def test_a_character_cut_off_by_the_token_limit_is_not_shown(qtbot, panel) -> None:
    panel.run_button.click()
    result = _result(1)
    result = Result(1, "infer", dataclasses.replace(result.value, text=" caf\ufffd"))
    with qtbot.waitSignal(panel.run_finished, timeout=5000) as finished:
        panel.bridge.host.play(TokenStreamed(1, 0, 100, " caf", 0.25), result)
    assert panel.output_edit.toPlainText() == " caf" and finished.args[0].text == " caf"


def test_run_needs_a_loaded_model(qtbot, panel) -> None:
    panel.state["map"] = None
    assert panel.run() is None and panel.bridge.host.requests == []


def test_map_helpers() -> None:
    assert map_summary({"a": 0, "b": 0, "c": "disk"}) == "cuda:0 2 · disk 1"
    assert map_diff({"a": 0, "b": "cpu"}, {"a": 0, "b": "disk", "c": "cpu"}) == [
        "b: cpu -> disk",
        "c: - -> cpu",
    ]
    assert map_digest({"b": 1, "a": 0}) == map_digest({"a": 0, "b": 1})
