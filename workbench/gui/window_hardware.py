"""Hardware and predicted speed of the main window: the active profile, budgets, speed label.

``WindowHardware`` is a part of the window: it receives the session, the undo stack, the
profile selector and the speed label, not the window. Profile switches and budget edits are
undo commands; the speed prediction runs on a worker thread after each change (debounced).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, QTimer
from PySide6.QtGui import QUndoStack
from PySide6.QtWidgets import QLabel

from workbench.gui import settings as app_settings
from workbench.gui.commands import SetBudgetsCommand, SetProfileCommand
from workbench.gui.hardware_selector import HardwareSelector, available_profiles
from workbench.gui.workers import TaskThread
from workbench.models.hardware import (
    DETECTED_NAME,
    host_probes_applied,
    with_cached_probes,
    with_host_measurements,
)
from workbench.runtime.formatting import format_forward, format_rate, format_ttft
from workbench.runtime.machine_attention import ATTENTION_ESTIMATED, predict_on_screen
from workbench.runtime.model_kind import generates_tokens
from workbench.runtime.precision_session import planned_tree
from workbench.runtime.session import Session

UNMEASURED_HOST = (
    "typical host costs: this machine's are measured at its first inference run, or with "
    "Tools > Measure this machine again"
)
"""Said beside a prediction for this machine made before its host probes were measured (a
fresh install: found showing 73.9 tok/s for a model that ran at 24)."""


class WindowHardware(QObject):
    """Hardware profile, budgets and the live speed prediction.

    Args:
        parent: the window (owner of the threads and the timer).
        session: the document whose profile and budgets change.
        undo_stack: where profile switches and budget edits go.
        selector: the toolbar's profile selector (its choice switches the profile).
        speed_label: shows the predicted tokens/s and TTFT.
        fit_problems: why the map does not fit the hardware (the lanes' budget problems);
            while there are any, no speed is shown for it.

    Attributes:
        profile: the active ``HardwareProfile`` (what the lanes and the speed model use).
        speed_thread: the running or last prediction thread.
        speed_prediction: the last prediction shown, or ``None``.
        speed_timer: debounces ``update_speed_prediction`` (start it after each change).
    """

    def __init__(
        self,
        parent: QObject,
        session: Session,
        undo_stack: QUndoStack,
        selector: HardwareSelector,
        speed_label: QLabel,
        fit_problems: Callable[[], Sequence[str]] = tuple,
    ) -> None:
        super().__init__(parent)
        self._fit_problems = fit_problems
        self.session = session
        self.undo_stack = undo_stack
        self.hardware_selector = selector
        self.speed_label = speed_label
        self.profile: Any = None
        self.speed_thread: TaskThread | None = None
        self.speed_prediction: Any = None
        self._listed: list[Any] = []
        self.speed_timer = QTimer(self)
        self.speed_timer.setSingleShot(True)
        self.speed_timer.setInterval(150)
        self.speed_timer.timeout.connect(self.update_speed_prediction)
        selector.profile_chosen.connect(self.set_hardware_profile)

    # --- hardware -----------------------------------------------------------------------

    def list_profiles(self, profiles: list[Any] | None) -> None:
        """Fill the selector: ``profiles`` (default: detected + bundled + user profiles) and
        the session's own profile; the session does not change."""
        profiles = available_profiles() if profiles is None else profiles
        if self.session.profile is not None:
            known = {p.name for p in profiles}
            if self.session.profile.name not in known:
                profiles = [*profiles, self.session.profile]
        self.hardware_selector.set_profiles(profiles)
        self._listed = list(profiles)

    def choose_first_profile(self) -> None:
        """Choose the session's profile, else the last one used, else the first listed
        (``list_profiles`` first); the session gets its budgets and stays clean."""
        profiles = self._listed
        name = app_settings.last_hardware()
        if self.session.profile is not None:
            name = self.session.profile.name
        profile = self.hardware_selector.profile(name) if name else None
        profile = profile or (profiles[0] if profiles else None)
        if profile is None:
            return
        self.hardware_selector.select_name(profile.name)
        self.profile = profile
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
        profile = self.session.profile or self.profile
        if profile is not None:
            app_settings.save_last_hardware(profile.name)

    def adopt_profile(self, profile: Any, *, replace: bool = True) -> None:
        """Make ``profile`` the active one, selected in the selector.

        Args:
            profile: a restored session's profile, or the session's after an undo.
            replace: put it in the selector in place of a listed profile of its name (a
                restored one is what the session saved); otherwise a listed one is selected.

        This machine's profile takes the probe figures cached since it was saved
        (``with_cached_probes``): found driving a restore, where the saved typical dispatch cost
        predicted 577 tok/s for a model the window had just shown at 172.
        """
        if getattr(profile, "name", "") == DETECTED_NAME:
            profile = with_cached_probes(profile)
        self.profile = profile
        if replace or not self.hardware_selector.select_name(profile.name):
            self.hardware_selector.add_profile(profile)

    def edit_budgets(self, budgets: dict[int | str, int]) -> None:
        """Set the budgets as one undo step ("Edit budgets")."""
        self.undo_stack.push(SetBudgetsCommand(self.session, budgets, "Edit budgets"))

    def update_speed_prediction(self, *, wait: bool = False) -> None:
        """Recompute tokens/s and TTFT for the current map on a worker thread (debounced
        after every change; O(modules), so a 98k-module tree never stalls the window).

        Args:
            wait: block until the prediction is shown (scripts and benchmarks).
        """
        self.speed_timer.stop()
        tree, profile = planned_tree(self.session), self.profile
        if tree is None or profile is None or not self.session.device_map:
            self.speed_prediction = None
            self.speed_label.setText("Predicted: —")
            return
        if self.speed_thread is not None and self.speed_thread.isRunning():
            self.speed_timer.start()  # try again when the running one is done
            if wait:
                self.speed_thread.wait()
                self.update_speed_prediction(wait=True)
            return
        device_map = dict(self.session.device_map)
        # each quantized Linear is read by its precision's kernel (the profile's kernel costs)
        precisions = dict(self.session.precision_map or {})
        thread = TaskThread(  # the model's attention (layout; this CPU's measured times)
            partial(predict_on_screen, precisions=precisions),
            self.session.opened,
            tree,
            device_map,
            profile,
        )
        thread.setObjectName("predict speed")
        thread.succeeded.connect(self._on_speed_thread_succeeded)
        thread.failed.connect(self._on_speed_thread_failed)
        self.speed_thread = thread
        thread.start()
        if wait:
            thread.wait()
            QCoreApplication.sendPostedEvents()  # deliver the queued result now

    def refresh_after_run(self) -> None:
        """After a run or a comparison: the worker measures this machine's host probes the
        first time (after the run's timing), and the precision planner (and a run's
        prediction) the CPU's kernel costs, so the detected profile takes the cached figures
        (three small reads), newer ones in place of its own, and the speed is predicted again
        when they changed, with the figures the comparison and the run used; no undo step."""
        if getattr(self.profile, "name", "") != DETECTED_NAME:
            return
        self._update_detected(with_cached_probes)

    def take_host_measurements(self, measured: Any) -> None:
        """This machine measured again (Tools > Measure this machine again): the detected
        profile, listed and active, takes the new figures and the speed is predicted again."""
        self._update_detected(lambda detected: with_host_measurements(detected, measured))

    def _update_detected(self, update: Callable[[Any], Any]) -> None:
        """Give the detected profile, listed and active, ``update``'s newer figures (the same
        hardware: no undo step); the speed is predicted again when the active one changed."""
        listed = self.hardware_selector.profile(DETECTED_NAME)
        if listed is not None and listed is not self.profile:
            self.hardware_selector.update_profile(update(listed))
        if getattr(self.profile, "name", "") != DETECTED_NAME:
            return
        updated = update(self.profile)  # the same object when nothing is new
        if updated is not self.profile:
            self.profile = updated
            self.hardware_selector.update_profile(updated)
            self.speed_timer.start()

    def _on_speed_thread_succeeded(self, result: tuple[Any, bool]) -> None:
        prediction, attention_estimated = result
        self.speed_prediction = prediction
        problems = list(self._fit_problems())
        if problems:  # a speed for a map that cannot run here would read as a promise
            self.speed_label.setText(
                f"<b>Predicted:</b> — {problems[0]}; no speed for a map that does not fit"
            )
            return
        name = getattr(self.profile, "name", "")
        where = "this machine" if name == DETECTED_NAME else name  # a what-if says which profile
        how = prediction.how
        if name == DETECTED_NAME and not host_probes_applied(self.profile):
            how += f"; {UNMEASURED_HOST}"
        elif name == DETECTED_NAME and attention_estimated:
            how += f"; {ATTENTION_ESTIMATED}"
        if not generates_tokens(self.session.opened):  # its inference test is one forward
            self.speed_label.setText(
                f"<b>Predicted for {where}:</b> "
                f"{format_forward(prediction.prefill_s, prediction.prompt_tokens)} ({how}; "
                "the model generates no tokens)"
            )
            return
        self.speed_label.setText(
            f"<b>Predicted for {where}:</b> {format_rate(prediction.tokens_per_s)}, "
            f"TTFT {format_ttft(prediction.ttft_s, prediction.prompt_tokens)} ({how})"
        )

    def _on_speed_thread_failed(self, exc: BaseException) -> None:
        self.speed_prediction = None
        self.speed_label.setText(f"Predicted: n/a — {exc}")
