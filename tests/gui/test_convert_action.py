"""Tools > Convert for loading: an open GGUF converts once on a worker thread into the cache
folder the load job looks in, with its own progress and Cancel; a cancelled conversion
leaves nothing, and a converted file is found again without converting."""

from __future__ import annotations

import threading
from pathlib import Path

import gguf
import pytest
from PySide6.QtCore import Qt
from tiny_gguf import write_tiny_gguf

from workbench.gui.convert_action import NEEDS_GGUF, THREAD_NAME, ConversionResult
from workbench.models.gguf_convert import convert_gguf, converted_folder
from workbench.runtime import LoadCancelled

pytestmark = pytest.mark.gui


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.Q8_0.gguf"
    write_tiny_gguf(path)
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The workbench cache of this test; converted folders go to ``<cache>/gguf``."""
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _left_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_the_action_waits_for_a_gguf(main_window, open_in_window, demo_dir) -> None:
    action = main_window.actions_by_name["convert_gguf"]
    assert action is main_window.gguf_conversion.action
    assert action in main_window.main_toolbar.actions()
    tools = next(a.menu() for a in main_window.menuBar().actions() if a.text() == "&Tools")
    assert action in tools.actions()
    assert not action.isEnabled() and action.toolTip().endswith(NEEDS_GGUF)
    open_in_window(main_window, demo_dir)  # a folder loads as it is: nothing to convert
    assert not action.isEnabled()
    assert main_window.gguf_conversion.start() is None


def test_convert_shows_progress_then_the_load_job_finds_the_folder(
    main_window, open_in_window, tiny_gguf, cache, qtbot
) -> None:
    open_in_window(main_window, tiny_gguf, timeout_ms=300_000)
    conversion = main_window.gguf_conversion
    action, widget = conversion.action, conversion.progress_widget
    assert action.isEnabled() and not widget.isVisible()
    labels: list[str] = []
    conversion.reported.connect(lambda _report: labels.append(widget.label.text()))
    with qtbot.waitSignal(conversion.finished, timeout=120_000) as done:
        action.trigger()
        assert conversion.thread is not None
        assert conversion.thread.objectName() == THREAD_NAME
        assert widget.isVisible() and not action.isEnabled()  # one conversion at a time
    result = done.args[0]
    assert isinstance(result, ConversionResult) and result.converted_now
    assert result.folder == converted_folder(tiny_gguf, cache_root=cache / "gguf")
    assert (result.folder / "config.json").is_file()
    assert _left_in(cache / "gguf") == [result.folder.name]  # no staging folder left
    assert any("converting tensors (20 of 20)" in label for label in labels), labels
    assert not widget.isVisible() and action.isEnabled()
    assert main_window.statusBar().currentMessage().startswith("Converted tiny-llama.Q8_0.gguf")
    assert main_window.session.source == str(tiny_gguf)  # the tree and the map stay
    main_window.session.set_device_map({"": "cpu"}, reason="test")  # this machine has no GPUs
    assert main_window.load_check.loadable, main_window.load_check.reason
    assert main_window.runtime_panels.load_action.isEnabled()  # the load job takes the folder
    # what the load job runs for a .gguf source: the cached folder, no second conversion
    stages: list[str] = []
    assert convert_gguf(tiny_gguf, progress=lambda r: stages.append(r.stage)) == result.folder
    assert stages == ["hashing file"]


def test_cancel_leaves_nothing_and_converting_again_works(
    main_window, open_in_window, tiny_gguf, cache, qtbot, monkeypatch
) -> None:
    open_in_window(main_window, tiny_gguf, timeout_ms=300_000)
    conversion = main_window.gguf_conversion
    widget = conversion.progress_widget
    entered, gate = threading.Event(), threading.Event()
    dequantize = gguf.dequantize

    def gated_dequantize(*args, **kwargs):  # holds the first tensor until Cancel is clicked
        entered.set()
        gate.wait()
        return dequantize(*args, **kwargs)

    monkeypatch.setattr(gguf, "dequantize", gated_dequantize)
    conversion.action.trigger()
    try:
        qtbot.waitUntil(entered.is_set, timeout=120_000)
        qtbot.waitUntil(lambda: "converting tensors (0 of 20)" in widget.label.text())
        with qtbot.waitSignal(conversion.failed, timeout=60_000) as failed:
            qtbot.mouseClick(widget.cancel_button, Qt.MouseButton.LeftButton)
            assert not widget.cancel_button.isEnabled()
            assert widget.label.text() == "Cancelling the conversion…"
            gate.set()
    finally:
        gate.set()
    assert isinstance(failed.args[0], LoadCancelled)
    assert _left_in(cache / "gguf") == []
    assert main_window.errors == []  # a cancel is no error
    assert "cancelled; nothing was kept" in main_window.statusBar().currentMessage()
    assert not widget.isVisible() and conversion.action.isEnabled()
    with qtbot.waitSignal(conversion.finished, timeout=120_000) as done:
        conversion.action.trigger()
    assert done.args[0].converted_now
    with qtbot.waitSignal(conversion.finished, timeout=60_000) as again:
        conversion.action.trigger()
    assert not again.args[0].converted_now and again.args[0].folder == done.args[0].folder
    assert "was converted before" in main_window.statusBar().currentMessage()


def test_a_file_that_cannot_convert_shows_an_error(
    main_window, open_in_window, tiny_gguf, cache, qtbot, tmp_path
) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(tiny_gguf.read_bytes())
    open_in_window(main_window, broken, timeout_ms=300_000)
    broken.write_bytes(tiny_gguf.read_bytes()[:4096])  # cut short after it was opened
    conversion = main_window.gguf_conversion
    with qtbot.waitSignal(conversion.failed, timeout=60_000) as failed:
        conversion.action.trigger()
    assert not isinstance(failed.args[0], LoadCancelled)
    [(title, text)] = main_window.errors
    assert title == "Could not convert the GGUF file"
    assert "broken.gguf" in text and "truncated" in text
    assert _left_in(cache / "gguf") == []
    assert conversion.action.isEnabled()
