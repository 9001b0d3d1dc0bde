"""The Inference tab's chat, sampling controls and verify, with real widgets and a real worker
process running a random-weight Llama whose tokenizer has a chat template."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chat_demo import make_chat_demo
from PySide6.QtCore import Qt

from workbench.gui.bridge import WorkerBridge
from workbench.gui.inference_panel import InferencePanel
from workbench.runtime.protocol import InferenceResult, Result

pytestmark = [pytest.mark.gui, pytest.mark.slow]

WAIT_MS = 180_000  # a cold worker imports torch + transformers on a shared 2-core machine


@pytest.fixture(scope="module")
def chat_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_chat_demo(tmp_path_factory.mktemp("chat") / "demo-chat")


@pytest.fixture
def live_panel(stop_resource_tracker: Any, qtbot: Any, tmp_path: Path) -> Iterator[Any]:
    """An Inference panel on a real worker; ``panel.state["map"]`` is the loaded map."""
    bridge = WorkerBridge(offload_root=tmp_path / "offload")
    state: dict[str, Any] = {"map": None}
    panel = InferencePanel(bridge, lambda: state["map"])
    panel.state = state  # type: ignore[attr-defined]
    qtbot.addWidget(panel)
    yield panel
    bridge.shutdown()


def _load(qtbot: Any, panel: Any, source: Path) -> None:
    with qtbot.waitSignal(
        panel.bridge.result, check_params_cb=lambda ev: ev.job == "load", timeout=WAIT_MS
    ):
        panel.bridge.load(source, {"": "cpu"}, dtype="float32")
    panel.state["map"] = {"": "cpu"}
    panel.set_available(True)


def _send(qtbot: Any, panel: Any, text: str) -> tuple[Any, InferenceResult]:
    """Type ``text`` in the message box, press Ctrl+Enter; return the record and the result."""
    results: list[InferenceResult] = []

    def keep(event: Result) -> None:
        if isinstance(event.value, InferenceResult):
            results.append(event.value)

    panel.bridge.result.connect(keep)
    panel.prompt_edit.clear()
    qtbot.keyClicks(panel.prompt_edit, text)
    with qtbot.waitSignal(panel.run_finished, timeout=WAIT_MS) as finished:
        qtbot.keyClick(panel.prompt_edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    panel.bridge.result.disconnect(keep)
    return finished.args[0], results[-1]


def test_run_without_a_loaded_model_is_disabled_and_says_why_once(
    live_panel: Any, qtbot: Any
) -> None:
    panel = live_panel
    assert not panel.run_button.isEnabled() and not panel.verify_button.isEnabled()
    assert panel.run() is None and panel.status_label.text() == (
        "cannot infer: no model is loaded; load one first"
    )
    # the panel still believes in a model the worker no longer has (it was never loaded)
    panel.state["map"] = {"": "cpu"}
    panel.set_available(True)
    assert panel.run() is None
    assert panel.status_label.text() == "cannot infer: no model is loaded; load one first"
    assert panel.history.model.rowCount() == 0


def test_a_multi_turn_chat_with_stop_sampling_and_verify(
    live_panel: Any, qtbot: Any, chat_demo: Path
) -> None:
    panel = live_panel
    assert panel.mode == "raw" and not panel.chat_view.isVisibleTo(panel)
    _load(qtbot, panel, chat_demo)
    # a model with a chat template opens in Chat, on a new chat
    assert panel.mode == "chat" and panel.chat_view.isVisibleTo(panel)
    assert not panel.output_edit.isVisibleTo(panel)
    assert "model's chat template" in panel.chat_view.template_label.text()
    panel.chat_view.system_edit.setText("Be brief.")
    panel.max_tokens_spin.setValue(4)

    first, result = _send(qtbot, panel, "What does the planner do?")
    assert result.chat_template and result.prompt_text == (
        "<s>system\nBe brief.</s>\n<s>user\nWhat does the planner do?</s>\n<s>assistant\n"
    )
    assert first.status == "done" and first.settings["mode"] == "Chat"
    assert first.settings["system prompt"] == "Be brief."
    assert first.settings["sampling"] == "greedy" and first.settings["max new tokens"] == 4
    assert first.settings["prompt built with"] == "the model's chat template"
    assert panel.prompt_edit.toPlainText() == ""  # sent: the message moved to the transcript
    answer = panel.chat_view.turns[1][1]
    assert panel.chat_view.turns == [("user", "What does the planner do?"), ("assistant", answer)]
    assert answer == result.text and first.text == answer
    transcript = panel.chat_view.plain_text()
    assert "What does the planner do?" in transcript and answer.strip() in transcript

    # the second turn carries the first: the worker gets the whole chat through the template
    second, result = _send(qtbot, panel, "And the disk?")
    assert result.prompt_text.startswith(
        "<s>system\nBe brief.</s>\n<s>user\nWhat does the planner do?</s>\n<s>assistant\n" + answer
    )
    assert result.prompt_text.endswith("<s>user\nAnd the disk?</s>\n<s>assistant\n")
    assert second.settings["turn"] == 2 and len(panel.chat_view.turns) == 4

    # Stop: the partial answer stays in the chat, marked stopped
    panel.max_tokens_spin.setValue(4096)
    qtbot.keyClicks(panel.prompt_edit, "Tell me everything.")
    with qtbot.waitSignal(panel.bridge.token, timeout=WAIT_MS):
        panel.run_button.click()
    assert panel.stop_button.isEnabled()
    with qtbot.waitSignal(panel.bridge.failed, timeout=WAIT_MS):
        panel.stop_button.click()
    stopped = panel.history.model.records[-1]
    assert stopped.status == "stopped" and 0 < stopped.new_tokens < 4096
    assert panel.chat_view.turns[-2] == ("user", "Tell me everything.")
    assert "(stopped)" in panel.chat_view.plain_text()
    assert panel.run_button.isEnabled()

    # sampling: the settings go to the worker and into the history
    panel.max_tokens_spin.setValue(3)
    panel.sampling_controls.greedy_check.setChecked(False)
    panel.sampling_controls.seed_spin.setValue(7)
    assert panel.side_tabs.tabText(2) == "Sampling: sampled"
    panel.new_chat_button.click()
    assert panel.chat_view.turns == [] and panel.chat_view.plain_text() == ""
    sampled, result = _send(qtbot, panel, "Hello")
    assert result.sampling == {
        "greedy": False,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 50,
        "seed": 7,
    }
    assert sampled.settings["sampling"] == "temperature 0.7, top-p 0.9, top-k 50, seed 7"
    assert sampled.settings["turn"] == 1  # a new chat

    # measured beside predicted, for this machine, in the panel and the history
    assert "on this machine" in panel.rate_label.text()
    assert sampled.predicted_for == "detected"
    row = panel.history.model.records.index(sampled)
    assert panel.history.model.index(row, 6).data().count("·") == 1

    # verify: logits, then the greedy continuation token by token
    panel.prompt_edit.setPlainText("The planner")
    with qtbot.waitSignal(panel.run_finished, timeout=WAIT_MS) as verified:
        panel.verify_button.click()
    record = verified.args[0]
    assert record.verify["passed"] and record.verify["greedy_compared"] == 16
    assert record.verify["greedy_text"] == record.verify["greedy_reference_text"]
    assert "greedy 16/16 tokens identical" in panel.verify_label.text()
