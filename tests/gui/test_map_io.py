"""Device-map files from the GUI: export, import with validation, bad files, copy as code."""

from __future__ import annotations

import json

import pytest
from PySide6.QtGui import QGuiApplication
from user_input import drop_file

from workbench.gui import map_io
from workbench.gui.tree_model import modules_mime_data

pytestmark = pytest.mark.gui


def _spread(window) -> dict:
    window.lanes.lane(0).dropMimeData(modules_mime_data(["embed"]))
    window.lanes.lane(1).dropMimeData(modules_mime_data(["layers.2", "layers.3"]))
    window.lanes.lane("disk").dropMimeData(modules_mime_data(["norm"]))
    return dict(window.session.device_map)


@pytest.mark.parametrize("wrapped", [False, True])
def test_export_then_import_gives_an_identical_map(tiny_window, tmp_path, wrapped) -> None:
    window = tiny_window
    planned = _spread(window)
    path = map_io.export_device_map(window, tmp_path / "map.json", wrapped=wrapped)
    data = json.loads(path.read_text())
    if wrapped:
        assert data["format"] == "workbench-device-map"
        assert data["model"]["class"] == "TinyLM" and data["model"]["nbytes"] == 2848
        assert data["model"]["profile"]["name"] == "test-2x24g"
    else:
        assert data == {k: v for k, v in planned.items()}  # the plain transformers format
    window.session.set_device_map({"": "cpu"}, reason="reset")
    dialog = map_io.import_device_map(window, path)
    assert dialog is not None and dialog.problems == []
    assert window.session.device_map == {"": "cpu"}  # nothing changes before OK
    dialog.accept()
    assert window.session.device_map == planned
    assert window.undo_stack.undoText() == "Import map from map.json"
    assert list(tmp_path.iterdir()) == [path]  # atomic write left no temporary file


BAD_FILES = {
    "invalid_json": ('{"embed": 0,,}', "not valid JSON (line 1"),
    "duplicate_keys": ('{"": 0, "": "cpu"}', "duplicate keys"),
    "bad_device": ('{"": "gpu0"}', "does not name a device: '': \"gpu0\""),
    "wrong_version": (
        '{"format": "workbench-device-map", "version": 99, "device_map": {"": 0}}',
        "version",
    ),
    "unknown_names": (
        '{"embed": 0, "layers": 0, "norm": 0, "head": 0, "decoder.block.7": 0, "lm_head": 1}',
        "2 unknown module name(s), not in TinyLM: decoder.block.7, lm_head",
    ),
    "uncovered": (
        '{"embed": 0, "layers": 0}',
        "uncovered module(s) or tensor(s) with no device: norm, head",
    ),
    "overlapping": ('{"": "cpu", "layers": 0}', "overlapping keys give different devices"),
    "not_in_profile": ('{"": 3}', "device(s) cuda:3 not in hardware profile 'test-2x24g'"),
    "not_utf8": (b'\xff\xfe{\x00"\x00"\x00:\x000\x00}', "not_utf8.json: not UTF-8 text (byte 0xff"),
    "bad_device_unknown_and_uncovered": (
        '{"embed": "gpu0", "nosuch": 0, "layers": 0}',
        "1 entry does not name a device: 'embed': \"gpu0\"",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_map_files_show_their_message_and_change_nothing(tiny_window, tmp_path, case) -> None:
    window = tiny_window
    before = _spread(window)
    steps = window.undo_stack.count()
    text, expected = BAD_FILES[case]
    path = tmp_path / f"{case}.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    dialog = map_io.import_device_map(window, path)
    if dialog is None:  # unreadable file: an error message, no dialog
        assert len(window.errors) == 1
        message = window.errors[0][1]
    else:  # readable but invalid: the dialog lists the problems, OK stays disabled
        message = dialog.message
        ok = dialog.buttons.button(dialog.buttons.StandardButton.Ok)
        assert not ok.isEnabled()
        dialog.accept()  # even a forced accept applies nothing
        assert not dialog.applied
        dialog.close()
    assert expected in message
    if dialog is None:
        assert str(path) in message  # the error names the file
    assert window.session.device_map == before
    assert window.undo_stack.count() == steps


def test_dropping_a_map_file_on_the_window_opens_the_import_dialog(tiny_window, tmp_path) -> None:
    window = tiny_window
    path = tmp_path / "drop.json"
    path.write_text(json.dumps({"": 1}))
    drop_file(window, path)
    dialogs = [d for d in window.findChildren(map_io.ImportDialog) if d.isVisible()]
    assert len(dialogs) == 1 and dialogs[0].problems == []
    dialogs[0].accept()
    assert window.session.device_map == {"": 1}


def test_copy_as_code_puts_a_runnable_snippet_on_the_clipboard(tiny_window) -> None:
    window = tiny_window
    planned = _spread(window)
    snippet = map_io.copy_as_code(window)
    assert QGuiApplication.clipboard().text() == snippet
    compile(snippet, "<snippet>", "exec")  # valid Python
    namespace: dict = {}
    exec(snippet.split("model = ")[0].split("from transformers")[1].split("\n", 1)[1], namespace)
    assert namespace["device_map"] == planned
    # Each 24 GiB GPU keeps the CUDA safety margin free: 0.5 GiB + 2% of 24 GiB =
    # 536,870,912 + 515,396,075 = 1,052,266,987 B, so 25,769,803,776 - 1,052,266,987 B stays,
    # which is not a whole number of GiB and is written byte-exact.
    gpu = 24 * 2**30 - (2**29 + int(0.02 * 24 * 2**30))
    assert namespace["max_memory"] == {0: gpu, 1: gpu, "cpu": "64GiB", "disk": "1024GiB"}
    assert 'offload_folder="offload"' in snippet
    assert "TinyLM.from_pretrained(" in snippet


def test_copy_as_code_asks_for_the_exact_budgets_disk_included(tiny_window) -> None:
    window = tiny_window
    _spread(window)
    budgets = {0: 1234567891, 1: 24 * 2**30, "cpu": 64 * 2**30, "disk": 2 * 10**12}
    window.session.set_budgets(budgets, reason="test")
    snippet = map_io.copy_as_code(window)
    namespace: dict = {}
    assignments = snippet.split("\nmodel = ")[0].split("from transformers")[1].split("\n", 1)[1]
    exec(assignments, namespace)  # TinyLM is no transformers class: run the dicts only
    assert namespace["max_memory"] == {0: 1234567891, 1: "24GiB", "cpu": "64GiB", "disk": "2000GB"}
    accelerate_utils = pytest.importorskip("accelerate.utils")
    parsed = {
        d: accelerate_utils.convert_file_size_to_int(v) for d, v in namespace["max_memory"].items()
    }
    assert parsed == window.session.budgets == budgets


def test_copy_as_code_for_a_bundled_config_names_its_hub_repo(main_window, open_in_window) -> None:
    from workbench.models.catalog import bundled_config_path

    window = main_window
    open_in_window(window, bundled_config_path("gpt2"))  # as File > What-if opens it
    snippet = map_io.copy_as_code(window)
    compile(snippet, "<snippet>", "exec")
    assert "GPT2LMHeadModel.from_pretrained(\n    'openai-community/gpt2'," in snippet
    assert "import torch" not in snippet  # dtype as stored: torch is not used
    assert "holds no weights" not in snippet
    namespace: dict = {}
    exec(snippet.split("model = ")[0], namespace)  # the imports and dicts run as written
    assert namespace["device_map"] == window.session.device_map


def test_copy_as_code_without_weights_or_repo_marks_the_placeholder(tiny_window) -> None:
    snippet = map_io.copy_as_code(tiny_window)
    assert "# tiny-lm holds no weights: put its Hub repo id or weights folder here\n" in snippet
    assert "    'path/to/checkpoint',\n" in snippet
    assert not snippet.startswith("import torch")
    compile(snippet, "<snippet>", "exec")


def test_copy_as_code_imports_torch_for_a_planning_dtype(tiny_window, tiny_opened) -> None:
    window = tiny_window
    window.set_opened("tiny-lm", tiny_opened.with_dtype("float16"), {"": "cpu"})
    snippet = map_io.copy_as_code(window)
    assert snippet.startswith("import torch\n")
    assert "    dtype=torch.float16,\n" in snippet
    compile(snippet, "<snippet>", "exec")


def test_diff_against_a_map_file_lists_moves_bytes_and_speed(tiny_window, tmp_path) -> None:
    from workbench.gui.diff_dialog import show_diff_against_file

    window = tiny_window
    path = map_io.export_device_map(window, tmp_path / "before.json")  # {"": "cpu"}
    _spread(window)
    dialog = show_diff_against_file(window, str(path))
    assert dialog is not None
    assert [name for name, _old, _new in dialog.diff.moved] == [
        "embed",
        "layers.2",
        "layers.3",
        "norm",
        "head",
    ]
    assert dialog.diff.bytes_before == {"cpu": 2848}
    assert dialog.diff.bytes_after == {0: 512, 1: 1152, "cpu": 1152, "disk": 32}
    assert "before:" in dialog.speed_label.text()
    dialog.close()


def test_the_import_dialog_lists_bad_devices_unknown_names_and_uncovered_modules_together(
    tiny_window, tmp_path
) -> None:
    window = tiny_window
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps({"embed": "gpu0", "nosuch": 0, "layers": 0, "extra": "tpu"}))
    dialog = map_io.import_device_map(window, path)
    assert dialog is not None and not window.errors
    assert len(dialog.problems) == 3, dialog.problems
    bad, unknown, uncovered = dialog.problems
    assert bad.startswith("2 entries do not name a device: 'embed': \"gpu0\", 'extra': \"tpu\"")
    assert unknown.startswith("2 unknown module name(s), not in TinyLM: extra, nosuch")
    assert "with no device: norm, head" in uncovered and "embed" not in uncovered
    assert not dialog.buttons.button(dialog.buttons.StandardButton.Ok).isEnabled()
    dialog.close()


def test_a_non_utf8_file_dropped_or_diffed_gives_a_clear_error(tiny_window, tmp_path) -> None:
    from workbench.gui.diff_dialog import show_diff_against_file

    window = tiny_window
    path = tmp_path / "latin1.json"
    path.write_bytes('{"embed": "cpu", "n\u00e4me": 0}'.encode("latin-1"))
    assert show_diff_against_file(window, str(path)) is None
    drop_file(window, path)
    assert [title for title, _ in window.errors] == [
        "Cannot read device map",
        "Cannot import device map",
    ]
    for _title, message in window.errors:
        assert message.startswith(f"{path}: not UTF-8 text (byte 0xe4 at offset 19)")
    assert window.session.device_map == {"": "cpu"}


def test_plan_then_export_then_import_through_the_gui_gives_an_identical_map(
    qtbot, tiny_window, tmp_path, monkeypatch
) -> None:
    from PySide6.QtWidgets import QFileDialog

    window = tiny_window
    panel = window.planner_panel
    panel.budget_editor.budgets_edited.emit({0: 1300, 1: 1300, "cpu": 10_000, "disk": 10**9})
    panel.reserve_by_bytes.setChecked(True)
    panel.reserve_gib.setValue(0)
    with qtbot.waitSignal(panel.comparison_ready, timeout=30_000):
        panel.compare_button.click()
    qtbot.waitUntil(lambda: not panel.thread.isRunning())
    panel.apply_buttons["balanced"].click()
    planned = dict(window.session.device_map)
    assert planned == panel.candidate("balanced").plan.device_map
    assert len(set(planned.values())) > 1  # a real spread, not everything on one device
    path = tmp_path / "planned.json"
    # the file dialogs are the only stand-ins: they return the path a user would pick
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(path), ""))
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))
    window.actions_by_name["export_map"].trigger()  # File > Export device map
    assert json.loads(path.read_text()) == planned
    window.lanes.lane("cpu").dropMimeData(modules_mime_data([""]))  # the user moves on
    assert window.session.device_map == {"": "cpu"}
    window.actions_by_name["import_map"].trigger()  # File > Import device map
    dialog = next(d for d in window.findChildren(map_io.ImportDialog) if d.isVisible())
    assert window.session.device_map == {"": "cpu"}  # nothing changes before OK
    dialog.buttons.button(dialog.buttons.StandardButton.Ok).click()
    assert window.session.device_map == planned
    assert window.undo_stack.undoText() == "Import map from planned.json"


def test_copy_as_code_carries_the_sessions_precision_map(
    main_window, open_in_window, demo_dir
) -> None:
    from workbench.gui.precision_column import push_precision

    open_in_window(main_window, demo_dir)
    plain = map_io.copy_as_code(main_window)
    assert "quantization_config" not in plain  # no precision chosen: the plain snippet
    assert push_precision(main_window.undo_stack, main_window.session, ["model.layers.0"], "int8")
    snippet = map_io.copy_as_code(main_window)
    compile(snippet, "<snippet>", "exec")
    assert "quantization_config=quantization_config," in snippet
    assert "TorchAoConfig(" in snippet and "Int8WeightOnlyConfig" in snippet
    assert r"'re:model\\.layers\\.(0)\\..*': Int8WeightOnlyConfig()" in snippet
    main_window.undo_stack.undo()  # the precision goes, and with it the quantization config
    assert "quantization_config" not in map_io.copy_as_code(main_window)
