"""Hardware and predicted speed of ``MainWindow``: the active profile, budgets, speed label.

A mixin so ``main_window.py`` stays about layout and state. Profile switches and budget edits
are undo commands; the speed prediction runs on a worker thread after each change.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QCoreApplication

from workbench.gui import settings as app_settings
from workbench.gui.commands import SetBudgetsCommand, SetProfileCommand
from workbench.gui.formatting import format_rate, format_ttft
from workbench.gui.hardware_selector import available_profiles
from workbench.gui.workers import TaskThread


class WindowHardwareMixin:
    """Hardware profile, budgets and the live speed prediction."""

    session: Any
    undo_stack: Any
    hardware_selector: Any
    speed_label: Any
    speed_thread: TaskThread | None
    speed_prediction: Any
    _profile: Any
    _speed_timer: Any

    # --- hardware -----------------------------------------------------------------------

    def hardware_profile(self) -> Any:
        """Return the active ``HardwareProfile`` (what the lanes and the speed model use)."""
        return self._profile

    def _init_hardware(self, profiles: list[Any] | None) -> None:
        profiles = available_profiles() if profiles is None else profiles
        name = app_settings.last_hardware()
        if self.session.profile is not None:
            name = self.session.profile.name
            known = {p.name for p in profiles}
            profiles = [*profiles, self.session.profile] if name not in known else profiles
        self.hardware_selector.set_profiles(profiles)
        profile = self.hardware_selector.profile(name) if name else None
        profile = profile or (profiles[0] if profiles else None)
        if profile is None:
            return
        self.hardware_selector.select_name(profile.name)
        self._profile = profile
        if self.session.profile is None:
            self.session.set_profile(profile, reason="start")
        if not self.session.budgets:  # only the profile carries over, not the last budgets
            self.session.set_budgets(profile.budgets(), reason="profile")
        self.session.mark_clean()

    def set_hardware_profile(self, profile: Any) -> None:
        """Switch to ``profile``: its budgets replace the current ones (one undo step)."""
        self.hardware_selector.add_profile(profile)
        self.undo_stack.push(SetProfileCommand(self.session, profile))

    def remember_hardware(self) -> None:
        """Persist the session's profile as the last hardware (after every change, undo and
        redo included, so the settings always match what the window shows)."""
        profile = self.session.profile or self._profile
        if profile is not None:
            app_settings.save_last_hardware(profile.name)

    def _on_hardware_profile_chosen(self, profile: Any) -> None:
        self.set_hardware_profile(profile)

    def _on_budget_editor_edited(self, budgets: dict[int | str, int]) -> None:
        self.undo_stack.push(SetBudgetsCommand(self.session, budgets, "Edit budgets"))

    def update_speed_prediction(self, *, wait: bool = False) -> None:
        """Recompute tokens/s and TTFT for the current map on a worker thread (debounced
        after every change; O(modules), so a 98k-module tree never stalls the window).

        Args:
            wait: block until the prediction is shown (scripts and benchmarks).
        """
        self._speed_timer.stop()
        tree, profile = self.session.tree, self._profile
        if tree is None or profile is None or not self.session.device_map:
            self.speed_prediction = None
            self.speed_label.setText("Predicted: —")
            return
        if self.speed_thread is not None and self.speed_thread.isRunning():
            self._speed_timer.start()  # try again when the running one is done
            if wait:
                self.speed_thread.wait()
                self.update_speed_prediction(wait=True)
            return
        from workbench.models.speed import predict_speed

        device_map = dict(self.session.device_map)
        thread = TaskThread(predict_speed, tree, device_map, profile)
        thread.setObjectName("predict speed")
        thread.succeeded.connect(self._on_speed_thread_succeeded)
        thread.failed.connect(self._on_speed_thread_failed)
        self.speed_thread = thread
        thread.start()
        if wait:
            thread.wait()
            QCoreApplication.sendPostedEvents()  # deliver the queued result now

    def _on_speed_thread_succeeded(self, prediction: Any) -> None:
        self.speed_prediction = prediction
        name = getattr(self._profile, "name", "")
        where = "this machine" if name == "detected" else name  # a what-if says which profile
        self.speed_label.setText(
            f"<b>Predicted for {where}:</b> {format_rate(prediction.tokens_per_s)}, "
            f"TTFT {format_ttft(prediction.ttft_s, prediction.prompt_tokens)} "
            f"({prediction.bottleneck}-bound, "
            f"prefetch {'on' if prediction.prefetch else 'off'})"
        )

    def _on_speed_thread_failed(self, exc: BaseException) -> None:
        self.speed_prediction = None
        self.speed_label.setText(f"Predicted: n/a — {exc}")
