"""Settings round trips (in a temporary folder) and the session autosave / restore."""

from __future__ import annotations

import json

import pytest
from PySide6.QtWidgets import QMessageBox, QPushButton

from workbench.gui import settings as app_settings
from workbench.gui.main_window import MainWindow
from workbench.gui.tree_model import modules_mime_data

pytestmark = pytest.mark.gui


def test_settings_live_in_the_temporary_folder(clean_settings) -> None:
    assert str(app_settings.app_settings().fileName()).startswith(str(clean_settings))
    assert str(app_settings.autosave_path()).startswith(str(clean_settings))


def test_recent_models_newest_first_deduplicated_and_bounded(clean_settings) -> None:
    for number in range(12):
        app_settings.add_recent_model(f"/models/m{number}")
    app_settings.add_recent_model("/models/m5")
    recents = app_settings.recent_models()
    assert recents[0] == "/models/m5"
    assert len(recents) == app_settings.MAX_RECENT
    assert recents[1:4] == ["/models/m11", "/models/m10", "/models/m9"]
    assert recents.count("/models/m5") == 1


def test_profile_geometry_and_splitters_survive_a_restart_but_edited_budgets_do_not(
    qtbot, main_window, test_profile
) -> None:
    window = main_window
    budgets = dict(window.session.budgets)
    budgets[1] = 20 * 1024**3
    window.budget_editor.spin_boxes[1].setValue(20.0)  # the user edits cuda:1 to 20 GiB
    assert window.session.budgets == budgets
    window.history_dock.close()  # the user closes a dock: the layout remembers it
    splitter_state = window.main_splitter.saveState()
    window.close()

    again = MainWindow(profiles=[test_profile])
    qtbot.addWidget(again)
    again.show()
    # only the profile carries over to the next launch: its budgets, not the edited ones
    assert again.session.budgets == test_profile.budgets() != budgets
    assert again.hardware_profile().name == "test-2x24g"
    saved = app_settings.window_state(["main"])
    assert saved["geometry"] == window.saveGeometry()  # restored by restoreGeometry
    assert again.history_dock.isHidden() and not again.planner_dock.isHidden()
    # (the offscreen screen is too small to show splitter positions; the state is kept)
    assert app_settings.window_state(["main"])["splitters"]["main"] == splitter_state
    again.close()


def test_autosave_is_written_and_offered_after_an_unclean_exit(
    qtbot, main_window, tiny_opened
) -> None:
    window = main_window
    window.set_opened("tiny-lm", tiny_opened, {"": "cpu"})
    window.lanes.lane(1).dropMimeData(modules_mime_data(["layers.3"]))
    window.autosave_now()
    path = app_settings.autosave_path()
    saved = json.loads(path.read_text())
    assert saved["device_map"] == window.session.device_map
    assert saved["source"] == "tiny-lm"
    assert app_settings.pending_autosave() == path  # a crash now would lose nothing
    window.close()  # asks first (unsaved changes); Discard is a clean exit, which removes it
    qtbot.waitUntil(lambda: window.documents.save_prompt is not None, timeout=5000)
    window.documents.save_prompt.button(QMessageBox.StandardButton.Discard).click()
    assert not window.isVisible()
    assert app_settings.pending_autosave() is None
    assert not path.exists()


def test_the_autosave_remembers_a_signal_until_the_next_autosave_or_discard(
    qapp, clean_settings
) -> None:
    app_settings.write_autosave({"source": "tiny-lm"})
    assert app_settings.autosave_closed_by() is None  # a crash from here on
    app_settings.set_autosave_closed_by("SIGTERM")
    assert app_settings.autosave_closed_by() == "SIGTERM"
    app_settings.write_autosave({"source": "tiny-lm"})  # a later run's work: not its signal
    assert app_settings.autosave_closed_by() is None
    app_settings.set_autosave_closed_by("SIGINT")
    app_settings.discard_autosave()
    assert app_settings.autosave_closed_by() is None and app_settings.pending_autosave() is None


@pytest.mark.slow  # opens a model with transformers on a worker thread
def test_restore_bar_reopens_the_model_with_its_map(qtbot, main_window, whatif_config) -> None:
    window = main_window
    saved_map = {"model.embed_tokens": 0, "model.layers": 1, "model.norm": "cpu", "lm_head": "cpu"}
    path = app_settings.write_autosave(
        {
            "format": "workbench-session",
            "version": 1,
            "source": str(whatif_config),
            "dtype": None,
            "device_map": saved_map,
            "budgets": [[0, 1000], [1, 2000], ["cpu", 3000], ["disk", 4000]],
            "reserve": 7,
            "planner_options": {},
            "profile": None,
        }
    )
    bar = window.offer_restore(path)
    restore = next(b for b in bar.findChildren(QPushButton) if "Restore" in b.text())
    restore.click()
    qtbot.waitUntil(lambda: window.session.tree is not None, timeout=60_000)
    qtbot.waitUntil(lambda: window.open_thread is not None and not window.open_thread.isRunning())
    assert window.session.device_map == saved_map
    assert window.session.budgets == {0: 1000, 1: 2000, "cpu": 3000, "disk": 4000}
    assert window.session.reserve == 7
    assert bar.isHidden()


def test_restart_restores_geometry_splitter_profile_and_recent_models(
    qtbot, clean_settings, test_profile
) -> None:
    from workbench.models.hardware import load_profile

    laptop = load_profile("cpu-laptop-16gb")
    profiles = [test_profile, laptop]
    first = MainWindow(profiles=profiles)
    qtbot.addWidget(first)
    first.show()
    assert first.hardware_profile().name == "test-2x24g"  # the default: the first profile
    first.setGeometry(21, 33, 760, 700)  # not the default size (fits the 800 px test screen)
    first.main_splitter.setSizes([230, 470])
    sizes = first.main_splitter.sizes()
    geometry = first.geometry()
    first.hardware_selector.setCurrentIndex(1)  # the user picks the laptop in the combo
    first.budget_editor.spin_boxes["cpu"].setValue(12.0)
    budgets = dict(first.session.budgets)
    for source in ("/models/a", "/models/b"):
        app_settings.add_recent_model(source)
    first.close()

    again = MainWindow(profiles=profiles)
    qtbot.addWidget(again)
    again.show()
    assert again.geometry() == geometry
    assert again.main_splitter.sizes() == sizes
    assert again.hardware_profile().name == "cpu-laptop-16gb"
    assert again.hardware_selector.currentText() == "cpu-laptop-16gb"
    assert budgets["cpu"] == 12 * 1024**3  # edited, and not carried over: the profile's
    assert again.session.budgets == laptop.budgets()
    assert [lane.device for lane in again.lanes.lanes] == ["cpu", "disk"]
    assert [a.text() for a in again.recent_menu.actions()] == ["/models/b", "/models/a"]
    again.close()


def test_settings_remember_the_profile_and_never_budgets(main_window, test_profile) -> None:
    from workbench.models.hardware import load_profile

    window = main_window
    original = dict(window.session.budgets)
    window.budget_editor.spin_boxes[0].setValue(1.0)
    assert app_settings.last_hardware() == "test-2x24g"
    assert not app_settings.app_settings().contains("hardware/budgets")
    window.undo_stack.undo()
    assert window.session.budgets == original
    laptop = load_profile("cpu-laptop-16gb")
    window.set_hardware_profile(laptop)
    assert app_settings.last_hardware() == "cpu-laptop-16gb"
    window.undo_stack.undo()  # undo follows into the settings
    assert app_settings.last_hardware() == "test-2x24g"


def test_first_run_window_takes_most_of_the_screen_and_fits_it(main_window) -> None:
    area = main_window.screen().availableGeometry()
    size = main_window.size()
    minimum = main_window.minimumSizeHint()
    assert size.width() <= max(area.width(), minimum.width())
    assert size.height() <= max(area.height(), minimum.height())
    assert size.width() >= min(area.width(), 1400) or size.width() == minimum.width()
    assert size.height() >= min(area.height(), 900) or size.height() == minimum.height()


def test_file_dialogs_start_where_their_kind_of_file_was_last_chosen(
    qtbot, clean_settings, main_window, tmp_path, monkeypatch
) -> None:
    """Not the folder the app was launched from: a session saved with the default name landed
    in the source checkout it was started in (Xvfb, stop 38)."""
    from pathlib import Path

    from workbench.gui.open_dialog import OpenModelDialog
    from workbench.gui.window_actions import open_dialog

    monkeypatch.chdir(tmp_path)
    assert app_settings.dialog_folder("session") == Path.home()
    models = tmp_path / "models"
    (models / "llama").mkdir(parents=True)
    app_settings.remember_dialog_folder("session", models / "llama" / "a.wbsession.json")
    assert app_settings.dialog_folder("session") == models / "llama"
    assert app_settings.dialog_folder("map") == Path.home()  # each kind its own
    (models / "llama").rmdir()
    assert app_settings.dialog_folder("session") == Path.home()  # gone: home again

    opened: list[str] = []
    open_dialog(main_window, opened.append)
    dialog = main_window.findChild(OpenModelDialog)
    assert dialog is not None and dialog.shown_folder == Path.home()
    dialog.chosen.emit(str(models))  # a model folder chosen
    dialog.close()
    assert opened == [str(models)]
    open_dialog(main_window, opened.append)
    again = [d for d in main_window.findChildren(OpenModelDialog) if d.isVisible()]
    assert again and again[-1].shown_folder == tmp_path  # beside the folder chosen last
    again[-1].close()
