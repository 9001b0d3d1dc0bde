"""The planner panel's memory model: controls persisted in QSettings, each lane's own reserve,
the "Why" list's reserve rows, staleness when the options change, the unknown-keys warning."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from workbench.gui.reserve_controls import ReserveControls
from workbench.models.intake import open_model
from workbench.runtime.formatting import format_nbytes
from workbench.runtime.planning import MemoryOptions, device_reserves

pytestmark = pytest.mark.gui

GIB = 1024**3
MIB = 1024**2


@pytest.fixture(scope="module")
def llama_8b():
    return open_model("llama-3.1-8b")


def _memory_mode(panel, context: int) -> None:
    panel.reserve_by_shape.setChecked(True)
    panel.reserve_controls.set_kv_dtype("fp16")
    panel.context_spin.setValue(context)


def test_each_lane_shows_its_own_reserve_and_apply_keeps_them(qtbot, main_window, llama_8b):
    window, panel = main_window, main_window.planner_panel
    window.set_opened("llama-3.1-8b", llama_8b, {"": 0})
    _memory_mode(panel, 16384)
    window.budget_editor.budgets_edited.emit({0: 12 * GIB, 1: 12 * GIB, "cpu": 64 * GIB})
    # everything on cuda:0: all 32 caches, 32 * 16384 * 8 * 256 * 2 B = 2 GiB, and the
    # activation peak of a 16k prefill, 512 MiB + 1344 MiB (see runtime's tests; activation_peak
    # may add small terms: within 1%)
    lane0 = window.lanes.lane(0)
    assert lane0.state.reserve_bytes == pytest.approx(2 * GIB + 1856 * MIB, rel=0.01)
    assert window.lanes.lane(1).state.reserve_bytes == 0  # runs no layer
    assert "layers 0-31 on cuda:0 need 2 GiB of KV cache at 16k context, fp16" in (
        lane0.bar.toolTip()
    )
    with qtbot.waitSignal(panel.comparison_ready, timeout=60_000):
        thread = panel.compare(("auto",))
    qtbot.waitUntil(lambda: not thread.isRunning(), timeout=5000)
    candidate = panel.candidate("auto")
    assert candidate.plan is not None, candidate.error
    reserve_rows = [
        panel.trace_view.topLevelItem(i)
        for i in range(panel.trace_view.topLevelItemCount())
        if panel.trace_view.topLevelItem(i).text(0) == "(reserve)"
    ]
    assert [row.text(1) for row in reserve_rows] == ["cuda:0", "cuda:1"]
    assert reserve_rows[0].text(3).startswith("layers 0-14 on cuda:0 need 960 MiB of KV cache")
    assert panel.apply("auto")
    expected = device_reserves(
        llama_8b, window.session.device_map, MemoryOptions(context=16384, kv_dtype="fp16")
    )
    for device in (0, 1):  # the lanes, the plan and the runtime function: one figure each
        lane = window.lanes.lane(device)
        assert lane.state.reserve_bytes == expected[device].nbytes == candidate.plan.reserve[device]
        assert f"+ {format_nbytes(expected[device].nbytes)} reserve" in lane.figures_label.text()
    assert window.session.reserve == candidate.plan.reserve[0]  # the execution device's share
    assert window.lanes.is_valid


def test_changing_the_context_updates_the_lanes_and_makes_the_comparison_stale(
    qtbot, main_window, llama_8b
) -> None:
    window, panel = main_window, main_window.planner_panel
    window.set_opened("llama-3.1-8b", llama_8b, {"": 0})
    _memory_mode(panel, 4096)
    window.budget_editor.budgets_edited.emit({0: 24 * GIB, 1: 24 * GIB, "cpu": 64 * GIB})
    short = window.lanes.lane(0).state.reserve_bytes
    with qtbot.waitSignal(panel.comparison_ready, timeout=60_000):
        thread = panel.compare(("sequential",))
    qtbot.waitUntil(lambda: not thread.isRunning(), timeout=5000)
    assert panel.apply_buttons["sequential"].isEnabled()
    panel.context_spin.setValue(8192)
    # the cache doubles (512 MiB -> 1 GiB), the activation peak too (464 MiB -> 928 MiB)
    assert window.lanes.lane(0).state.reserve_bytes == 2 * short
    assert not panel.apply_buttons["sequential"].isEnabled()
    assert "reserve options changed" in panel.stale_label.text()


def test_the_controls_are_remembered(main_window) -> None:
    controls = main_window.planner_panel.reserve_controls
    controls.by_model.setChecked(True)
    controls.batch_spin.setValue(3)
    controls.context_spin.setValue(65536)
    controls.set_kv_dtype("int8")
    controls.set_kv_engine("vllm")
    again = ReserveControls()
    assert again.memory_options() == MemoryOptions(
        batch=3, context=65536, kv_dtype="int8", engine="vllm"
    )
    controls.context_spin.setValue(0)  # "model max"
    assert ReserveControls().memory_options().context is None
    controls.by_bytes.setChecked(True)
    assert ReserveControls().memory_options() is None


def test_config_keys_the_memory_model_does_not_know_are_named(main_window, tmp_path: Path) -> None:
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    config.attention_window = 256
    config.save_pretrained(tmp_path)
    window, panel = main_window, main_window.planner_panel
    panel.reserve_by_shape.setChecked(True)
    window.set_opened(str(tmp_path), open_model(tmp_path / "config.json"))
    note = panel.memory_note
    assert note.isVisible() and note.property("warned")
    assert "attention_window=256" in note.text()
    llama = open_model("llama-3.1-8b")
    window.set_opened("llama-3.1-8b", llama)
    assert not note.property("warned")
    panel.context_spin.setValue(0)
    assert note.text() == "Planning for 32,768 tokens of context"


def test_the_default_controls_are_the_clis_default_options(qtbot, clean_settings) -> None:
    # `workbench plan MODEL` without memory flags plans with MemoryOptions(): the same numbers
    controls = ReserveControls()
    qtbot.addWidget(controls)
    assert controls.memory_options() == MemoryOptions()
    assert controls.prefill_spin.text() == "prefill = context"


def test_the_prefill_field_shrinks_the_lane_reserve_and_is_remembered(
    qtbot, main_window, llama_8b
) -> None:
    window, panel = main_window, main_window.planner_panel
    controls = panel.reserve_controls
    window.set_opened("llama-3.1-8b", llama_8b, {"": 0})
    _memory_mode(panel, 32768)
    whole = window.lanes.lane(0).state.reserve_bytes
    with qtbot.waitSignal(controls.changed):
        controls.prefill_spin.setValue(2048)
    options = MemoryOptions(context=32768, kv_dtype="fp16", prefill_tokens=2048)
    assert controls.memory_options() == options
    (expected,) = device_reserves(llama_8b, {"": 0}, options).values()
    lane = window.lanes.lane(0)
    # the cache is the 32k context's, 32 x 32768 x 8 x 256 x 2 B = 4 GiB, either way; the
    # activation peak is a 2048-token forward's, not a 32k one's
    assert lane.state.reserve_bytes == expected.nbytes < whole
    assert expected.kv_nbytes == 4 * GIB
    assert "for 2k-token prefill chunks" in lane.bar.toolTip()
    assert panel.memory_note.text() == (
        "Planning for 32,768 tokens of context, prefill in 2,048-token chunks"
    )
    assert ReserveControls().memory_options() == options  # persisted in the settings
    controls.prefill_spin.setValue(0)
    assert ReserveControls().memory_options().prefill_tokens is None


def test_a_restored_sessions_options_show_in_the_controls(qtbot, clean_settings) -> None:
    controls = ReserveControls()
    qtbot.addWidget(controls)
    options = MemoryOptions(batch=2, context=8192, kv_dtype="int8", engine="vllm",
                            context_cap=65536, prefill_tokens=1024)  # fmt: skip
    with qtbot.waitSignal(controls.changed):
        controls.set_memory_options(options)
    assert controls.memory_options() == options
    assert ReserveControls().memory_options() == options
    controls.set_memory_options(None)
    assert controls.by_bytes.isChecked() and controls.memory_options() is None


def test_restoring_a_session_restores_its_memory_options(
    qtbot, main_window, whatif_config: Path, test_profile, tmp_path: Path
) -> None:
    from workbench.runtime.session import Session

    options = MemoryOptions(batch=2, context=1024, prefill_tokens=256)
    path = Session(source=str(whatif_config), device_map={"": 0}, budgets=test_profile.budgets(),
                   memory=options, profile=test_profile).save(tmp_path / "m.wbsession.json")  # fmt: skip
    window = main_window
    window.restore_session_file(path)
    qtbot.waitUntil(lambda: window.session.tree is not None or bool(window.errors), timeout=60_000)
    qtbot.waitUntil(lambda: not window.open_thread.isRunning(), timeout=10_000)
    assert not window.errors, window.errors
    assert window.session.memory == options and not window.session.dirty
    reserves = window.session.device_reserves()
    assert reserves is not None and reserves[0].why.endswith("for 256-token prefill chunks")
    # the controls show the restored options, and an edit there reaches the session (saved)
    assert window.planner_panel.memory_options() == options
    window.planner_panel.context_spin.setValue(2048)
    assert window.session.memory.context == 2048 and window.session.dirty


def test_a_model_opened_in_the_window_keeps_the_controls_options(
    main_window, whatif_config: Path
) -> None:
    window, panel = main_window, main_window.planner_panel
    window.set_opened(str(whatif_config), open_model(str(whatif_config)), None)
    assert window.session.memory == panel.memory_options() and not window.session.dirty


def test_restoring_a_session_restores_its_precision_map(
    qtbot, main_window, whatif_config: Path, test_profile, tmp_path: Path
) -> None:
    """A session saved (or autosaved before a crash) with a precision map comes back with it:
    the Precision column and the quantized sizes, not the model's dtype."""
    from workbench.runtime.session import Session

    layer = "model.layers.0"
    path = Session(source=str(whatif_config), device_map={"": 0}, budgets=test_profile.budgets(),
                   profile=test_profile, precision_map={layer: "nf4"}).save(tmp_path / "p.wbsession.json")  # fmt: skip
    window = main_window
    window.restore_session_file(path)
    qtbot.waitUntil(lambda: window.session.tree is not None or bool(window.errors), timeout=60_000)
    qtbot.waitUntil(lambda: not window.open_thread.isRunning(), timeout=10_000)
    assert not window.errors, window.errors
    assert window.session.precision_map == {layer: "nf4"} and not window.session.dirty
