"""The inference panel and run history, driven by a scripted host whose answers come from a
background thread (the real worker runs in test_load_flow.py)."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
from PySide6.QtCore import QItemSelectionModel, Qt
from PySide6.QtGui import QTextCursor

from workbench.gui.bridge import WorkerBridge
from workbench.gui.inference_panel import InferencePanel
from workbench.runtime.protocol import (
    PROBING_HOST,
    PROBING_WORKSPACE,
    Failed,
    InferenceResult,
    LayerTiming,
    Phase,
    Result,
    Sampling,
    TokenStreamed,
    VerifyResult,
)
from workbench.runtime.run_records import map_digest

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
    options = {"max_new_tokens": 3, "sampling": Sampling(True, 0.7, 0.9, 50), "profile": None}
    assert host.requests == [("infer", "The quick brown fox", options)]
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
    assert panel.ttft_title.text() == "time to first token"
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
        and panel.layer_table.item(2, 3).text() == "4 MiB"
    )
    assert panel.layer_table.item(1, 5).text() == "3.00"
    assert panel.run_button.isEnabled()


def test_the_status_says_what_the_worker_measures_after_the_tokens(qtbot, panel) -> None:
    host = panel.bridge.host
    rid = panel.run()
    assert panel.status_label.text() == "infer running…"
    with qtbot.waitSignal(panel.bridge.phase, timeout=5000):
        host.play(Phase(rid, PROBING_HOST))
    assert panel.status_label.text() == "measuring this machine…"
    assert "once per machine" in panel.status_label.toolTip()
    with qtbot.waitSignal(panel.bridge.phase, timeout=5000):
        host.play(Phase(rid, PROBING_WORKSPACE))
    assert panel.status_label.text() == "measuring matmul memory…"
    assert "once per prompt length" in panel.status_label.toolTip()
    seen: list[Phase] = []
    panel.bridge.phase.connect(seen.append)  # after the panel's slot: it has run for each
    host.play(Phase(rid + 7, PROBING_HOST), Phase(rid, "generating"))  # another job; a phase
    qtbot.waitUntil(lambda: len(seen) == 2, timeout=5000)
    assert panel.status_label.text() == "measuring matmul memory…"  # neither is shown
    with qtbot.waitSignal(panel.run_finished, timeout=5000):
        host.play(_result(rid))
    assert panel.status_label.text() == "infer done"


def test_a_run_that_paged_weights_in_says_so_beside_its_time_to_first_token(qtbot, panel) -> None:
    rid = panel.run()
    result = _result(rid)
    paged = dataclasses.replace(result.value, paged_in_bytes=257 * 2**20)
    with qtbot.waitSignal(panel.run_finished, timeout=5000):
        panel.bridge.host.play(dataclasses.replace(result, value=paged))
    assert panel.ttft_label.text() == "250 ms (predicted 200 ms) · paged in 257 MiB"
    assert "This run paged in 257 MiB of memory-mapped weights on first use" in (
        panel.ttft_label.toolTip()
    )
    rid = panel.run()  # the next run touches them again: nothing to say
    with qtbot.waitSignal(panel.run_finished, timeout=5000):
        panel.bridge.host.play(_result(rid))
    assert panel.ttft_label.text() == "250 ms (predicted 200 ms)"
    assert "paged in" not in panel.ttft_label.toolTip()


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
    assert panel.history.model.records[0].status == "stopped"
    assert panel.status_label.text() == "infer stopped: by the user (0 tokens generated)"
    assert panel.run_button.isEnabled()
    failing = panel.run()
    with qtbot.waitSignal(panel.bridge.failed, timeout=5000):
        host.play(Failed(failing, "infer failed: RuntimeError: boom", "Traceback …", job="infer"))
    assert panel.history.model.records[1].status == "failed"
    assert panel.status_label.text() == "infer failed: RuntimeError: boom (0 tokens generated)"
    assert "Traceback …" in panel.status_label.toolTip()
    verifying = panel.verify()
    with qtbot.waitSignal(panel.bridge.failed, timeout=5000):
        host.play(
            Failed(verifying, "the worker exited with code -9", kind="worker_died", job="verify")
        )
    assert panel.status_label.text() == (
        "verify failed: the worker exited with code -9; load a model to run it"
    )
    assert "failed" in panel.verify_label.text()


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


def _stop(qtbot, panel, request_id: int, *tokens: TokenStreamed) -> None:
    """Stream ``tokens``, press Stop, and answer as the worker does: one cancelled failure."""
    host = panel.bridge.host
    if tokens:
        with qtbot.waitSignal(panel.bridge.token, timeout=5000):
            host.play(*tokens)
    panel.stop_button.click()
    assert host.requests[-1] == ("cancel",)
    cancelled = Failed(
        request_id, "infer cancelled: cancelled by the user", kind="cancelled", job="infer"
    )
    with qtbot.waitSignal(panel.bridge.failed, timeout=5000):
        host.play(cancelled)


def test_a_stopped_run_keeps_its_partial_figures(qtbot, panel, caplog) -> None:
    caplog.set_level(logging.INFO, logger="workbench.gui.inference_panel")
    host = panel.bridge.host
    panel.units = ["embed", "layers.0", "layers.1"]
    panel.run_button.click()
    with qtbot.waitSignal(panel.run_finished, timeout=5000):
        host.play(_result(1))
    assert panel.layer_caption.text() == "last forward of run 1"
    panel.max_tokens_spin.setValue(4096)
    panel.run_button.click()
    assert panel.layer_caption.text() == "from run 1 (previous run); run 2 running…"
    # first token at 50 ms, then one every 100 ms: 4 tokens, 3 intervals in 0.3 s = 10 tok/s
    _stop(qtbot, panel, 2, *[TokenStreamed(2, i, 7, "x", 0.05 + 0.1 * i) for i in range(4)])
    labels = (panel.ttft_label, panel.rate_label, panel.tokens_label, panel.status_label)
    assert not any("…" in label.text() for label in labels), [lab.text() for lab in labels]
    assert panel.ttft_label.text() == "50 ms"
    assert panel.rate_label.text().startswith("10") and "until stopped" in panel.rate_label.text()
    assert panel.tokens_label.text() == "4 new (stopped)"
    # the worker's message already names the job: said once
    assert panel.status_label.text() == "infer stopped: cancelled by the user (4 tokens generated)"
    record = panel.history.model.records[1]
    assert record.status == "stopped" and record.new_tokens == 4 and record.text == "xxxx"
    assert record.ttft_s == 0.05 and record.tokens_per_s == pytest.approx(10.0)
    row = [panel.history.model.index(1, c).data() for c in range(6)]
    assert row[3] == panel.rate_label.text().split(" (")[0] and row[4] == "50 ms"
    assert row[5] == "stopped after 4 tokens"
    # the per-layer table still holds run 1's forward, and says so
    assert panel.layer_table.rowCount() == 3
    assert panel.layer_caption.text() == "from run 1 (previous run); run 2 stopped, no timings"
    messages = [r.getMessage() for r in caplog.records if r.name.endswith("inference_panel")]
    assert any(
        m.startswith("infer run 1 ") and "3 tokens" in m and "TTFT 250 ms" in m for m in messages
    )
    assert any(
        m.startswith("infer run 2 ") and "stopped: cancelled by the user" in m for m in messages
    )


def test_a_run_stopped_before_its_first_token_shows_no_figures(qtbot, panel) -> None:
    panel.run_button.click()
    assert panel.ttft_label.text() == "…" and panel.rate_label.text() == "…"
    _stop(qtbot, panel, 1)
    assert panel.ttft_label.text() == "—" and panel.rate_label.text() == "—"
    assert panel.tokens_label.text() == "0 new (stopped)"
    assert panel.layer_caption.text() == "run 1 stopped, no timings"
    record = panel.history.model.records[0]
    assert record.ttft_s is None and record.tokens_per_s is None
    row = [panel.history.model.index(0, c).data() for c in (3, 4, 5)]
    assert row == ["—", "—", "stopped after 0 tokens"]


def test_verify_results_are_logged(qtbot, panel, caplog) -> None:
    caplog.set_level(logging.INFO, logger="workbench.gui.inference_panel")
    panel.verify_button.click()
    passed = VerifyResult(True, 0.0, 0.0, True, "undispatched cpu", (1, 5, 32))
    with qtbot.waitSignal(panel.run_finished, timeout=5000):
        panel.bridge.host.play(Result(1, "verify", passed))
    assert [r.getMessage() for r in caplog.records] == [
        f"verify run 1 (map {map_digest(MAP_A)}): PASS, max abs diff 0, max rel diff 0"
    ]


GREEDY_PASS = VerifyResult(
    True, 0.0, 0.0, True, "undispatched cpu", (1, 5, 32), greedy_compared=16, greedy_matched=16
)


def test_a_new_run_clears_the_verdict_of_an_earlier_verify(qtbot, panel) -> None:
    host = panel.bridge.host
    panel.max_tokens_spin.setValue(16)
    panel.verify_button.click()
    with qtbot.waitSignal(panel.run_finished, timeout=5000):
        host.play(Result(1, "verify", GREEDY_PASS))
    assert "greedy 16/16 tokens identical" in panel.verify_label.text()
    panel.prompt_edit.setPlainText("Another prompt")
    panel.max_tokens_spin.setValue(64)
    panel.run_button.click()
    assert panel.verify_label.text() == "not verified" and panel.verify_label.toolTip() == ""
    _stop(qtbot, panel, 2, *[TokenStreamed(2, i, 7, "x", 0.05 + 0.1 * i) for i in range(37)])
    assert panel.tokens_label.text() == "37 new (stopped)"
    assert panel.verify_label.text() == "not verified"
    # the history keeps both runs, the verdict with its own run
    verify_record, infer_record = panel.history.model.records
    assert verify_record.verify["passed"] and verify_record.verify["greedy_compared"] == 16
    assert infer_record.max_new_tokens == 64 and infer_record.verify is None


def test_a_verify_for_a_model_switched_away_is_logged_not_shown(qtbot, panel, caplog) -> None:
    caplog.set_level(logging.INFO, logger="workbench.gui.inference_panel")
    host = panel.bridge.host
    panel.verify_button.click()
    assert panel.verify_label.text() == "verifying…"
    panel.clear_results()  # another model came on screen while the verify ran
    with qtbot.waitSignal(panel.run_finished, timeout=5000) as finished:
        host.play(Result(1, "verify", GREEDY_PASS))
    assert panel.verify_label.text() == "not verified"
    assert finished.args[0].verify["passed"] and panel.history.model.records[0].status == "done"
    assert panel.status_label.text() == "verify run 1 done for another model; see history"
    messages = [r.getMessage() for r in caplog.records if r.name.endswith("inference_panel")]
    assert messages == [
        f"verify run 1 (map {map_digest(MAP_A)}): PASS, max abs diff 0, max rel diff 0"
        " (for a model no longer on screen: not shown)"
    ]
    # a failure of such a verify is not shown either; the next verify shows its verdict again
    panel.verify_button.click()
    panel.clear_results()
    with qtbot.waitSignal(panel.bridge.failed, timeout=5000):
        host.play(Failed(2, "verify failed: RuntimeError: boom", job="verify"))
    assert panel.verify_label.text() == "not verified"
    assert panel.history.model.records[1].status == "failed"
    panel.verify_button.click()
    with qtbot.waitSignal(panel.run_finished, timeout=5000):
        host.play(Result(3, "verify", GREEDY_PASS))
    assert "greedy 16/16 tokens identical" in panel.verify_label.text()


def test_ctrl_enter_in_the_prompt_runs(qtbot, panel) -> None:
    host = panel.bridge.host
    panel.prompt_edit.setPlainText("hello")
    qtbot.keyClick(panel.prompt_edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    options = {"max_new_tokens": 16, "sampling": Sampling(True, 0.7, 0.9, 50), "profile": None}
    assert host.requests == [("infer", "hello", options)]
    assert panel.prompt_edit.toPlainText() == "hello"  # no new line either
    qtbot.keyClick(panel.prompt_edit, Qt.Key.Key_Enter, Qt.KeyboardModifier.ControlModifier)
    assert len(host.requests) == 1  # Run is disabled while the first run is in flight
    panel.prompt_edit.moveCursor(QTextCursor.MoveOperation.End)
    qtbot.keyClick(panel.prompt_edit, Qt.Key.Key_Return)
    assert panel.prompt_edit.toPlainText() == "hello\n" and len(host.requests) == 1


def test_controls_and_columns_explain_themselves(panel) -> None:
    for widget in (panel.run_button, panel.stop_button, panel.max_tokens_spin):
        assert widget.toolTip(), widget
    assert "Ctrl+Enter" in panel.run_button.toolTip()
    tips = {
        panel.layer_table.horizontalHeaderItem(c).text(): panel.layer_table.horizontalHeaderItem(
            c
        ).toolTip()
        for c in range(panel.layer_table.columnCount())
    }
    assert all(tips.values()), tips
    assert "decimal" in tips["rate"] and "10^9" in tips["rate"]
    assert "2^20" in tips["size"] and "disk" in tips["from"]
    model = panel.history.model
    map_tip = model.headerData(2, Qt.Orientation.Horizontal, Qt.ItemDataRole.ToolTipRole)
    assert "device map" in map_tip


def test_the_panel_fits_a_short_dock(qtbot, panel) -> None:
    panel.resize(1200, 150)  # the Inference tab of a ~200 px Runtime dock
    panel.show()
    qtbot.waitExposed(panel)
    assert panel.minimumSizeHint().height() <= 150
    assert panel.height() == 150
    for widget in (panel.run_button, panel.stop_button, panel.prompt_edit, panel.output_edit):
        assert not widget.visibleRegion().isEmpty(), widget


def test_long_figures_wrap_instead_of_widening_the_left_side(qtbot, panel) -> None:
    from PySide6.QtWidgets import QSplitter

    splitter = panel.findChild(QSplitter)
    left = splitter.widget(0)
    narrowest = left.minimumSizeHint().width()
    panel.ttft_label.setText("97 ms (predicted 77 ms)")
    panel.rate_label.setText("21.9 tok/s (predicted 26.1 tok/s)")
    panel.verify_label.setText("PASS max |abs| 0 · max rel 0 (bitwise identical)")
    assert left.minimumSizeHint().width() == narrowest  # the figures wrap


def test_tokens_without_printable_text_say_so(qtbot, panel) -> None:
    from workbench.runtime.protocol import LoadSummary

    summary = LoadSummary(
        "/cache/demo-llama-60m", "LlamaForCausalLM", MAP_A, {}, 1.0, 1, True, True
    )
    panel.bridge.host.play(Result(99, "load", summary))  # the panel learns what is loaded
    qtbot.waitUntil(lambda: panel.loaded_summary is not None, timeout=5000)
    assert panel.mode == "raw"  # no chat template: raw prompt mode
    panel.run_button.click()
    blank = dataclasses.replace(_result(1).value, text=" \n\u200b", new_tokens=16)
    with qtbot.waitSignal(panel.run_finished, timeout=5000):
        panel.bridge.host.play(Result(1, "infer", blank))
    note = "16 tokens, no printable text: the demo model has random weights"
    assert panel.tokens_label.text() == note and panel.output_edit.placeholderText() == note


def test_sampling_settings_are_sent_and_kept_with_the_run(qtbot, panel) -> None:
    controls = panel.sampling_controls
    assert controls.greedy_check.isChecked() and not controls.temperature_spin.isEnabled()
    assert panel.side_tabs.tabText(2) == "Sampling: greedy"
    controls.greedy_check.setChecked(False)  # sampling: its settings come alive
    assert all(
        spin.isEnabled()
        for spin in (controls.temperature_spin, controls.top_p_spin, controls.top_k_spin)
    )
    controls.temperature_spin.setValue(1.2)
    controls.seed_spin.setValue(9)
    controls.repetition_spin.setValue(1.3)
    assert panel.side_tabs.tabText(2) == "Sampling: sampled"
    panel.run_button.click()
    sent = panel.bridge.host.requests[-1][2]["sampling"]
    assert sent == Sampling(False, 1.2, 0.9, 50, 1.3, 9)
    with qtbot.waitSignal(panel.run_finished, timeout=5000) as finished:
        panel.bridge.host.play(_result(1))
    record = finished.args[0]
    expected = "temperature 1.2, top-p 0.9, top-k 50, seed 9, repetition penalty 1.3"
    assert record.settings["sampling"] == expected and record.settings["mode"] == "Raw prompt"
    assert panel.history.model.index(0, 6).data() == "10 tok/s · 200 ms"  # predicted beside
    flags = QItemSelectionModel.SelectionFlag.Select | QItemSelectionModel.SelectionFlag.Rows
    panel.history.view.selectionModel().select(panel.history.model.index(0, 0), flags)
    assert f"sampling: {expected}" in panel.history.details.toPlainText()


def test_a_model_that_generates_nothing_shows_its_forward_time(qtbot, panel, caplog) -> None:
    caplog.set_level(logging.INFO, logger="workbench.gui.inference_panel")
    host = panel.bridge.host
    panel.run_button.click()
    value = InferenceResult(  # what a BERT masked LM's run returns: one forward, no tokens
        text="",
        prompt_tokens=5,
        new_tokens=0,
        ttft_s=0.03,
        tokens_per_s=5 / 0.03,  # prompt tokens per second: no decode speed to show
        total_s=0.03,
        predicted={"tokens_per_s": 400.0, "ttft_s": 0.0045, "forward_s": 0.002},
        stop_reason="forward",
        predicted_for="detected",
    )
    with qtbot.waitSignal(panel.run_finished, timeout=5000) as finished:
        host.play(Result(1, "infer", value))
    record = finished.args[0]
    assert record.one_forward and record.tokens_per_s is None and record.ttft_s == 0.03
    shown = "30 ms, one forward over 5 tokens (predicted 2.0 ms on this machine)"
    assert panel.ttft_label.text() == shown
    assert panel.rate_label.text() == "— (the model generates no tokens)"
    assert panel.ttft_title.text() == "forward time"  # no first token to time
    row = [panel.history.model.index(0, c).data() for c in range(7)]
    assert row[3] == "—" and row[4] == "30 ms" and row[5] == "one forward"
    assert row[6] == "forward 2.0 ms"
    messages = [r.getMessage() for r in caplog.records if r.name.endswith("inference_panel")]
    assert any(
        m.startswith("infer run 1 ")
        and m.endswith(": one forward in 30 ms (predicted 2.0 ms on this machine)")
        for m in messages
    ), messages
    assert not any("tok/s" in m for m in messages)


def test_a_new_load_clears_the_figures_of_a_run_on_the_load_before(qtbot, panel) -> None:
    """Reloaded (in nf4, say), the panel showed the bfloat16 run's TTFT and tok/s under the new
    load's name; the figures, the verdict and the layers wait for a run on this load, and the
    run history keeps the earlier run."""
    from workbench.runtime.protocol import LoadSummary

    panel.units = ["embed", "layers.0", "layers.1"]
    panel.run_button.click()
    with qtbot.waitSignal(panel.run_finished, timeout=5000):
        panel.bridge.host.play(_result(1))
    assert panel.rate_label.text() == "12.5 tok/s (predicted 10 tok/s)"
    assert panel.layer_table.rowCount() == 3
    summary = LoadSummary(
        "/cache/demo-llama-60m", "LlamaForCausalLM", MAP_B, {}, 1.0, 1, True, True
    )
    panel.bridge.host.play(Result(99, "load", summary))
    qtbot.waitUntil(lambda: panel.loaded_summary is not None, timeout=5000)
    labels = (panel.ttft_label, panel.rate_label, panel.tokens_label)
    assert [label.text() for label in labels] == ["—", "—", "—"]
    assert panel.layer_table.rowCount() == 0 and panel.output_edit.toPlainText() == ""
    assert panel.history.model.rowCount() == 1
