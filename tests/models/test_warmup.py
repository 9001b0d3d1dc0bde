"""The transformers warm-up thread: started once, joined by the first open, never raced."""

from __future__ import annotations

import sys
import threading

from workbench.models import warmup
from workbench.models.intake import open_model


def test_warm_up_starts_once_and_open_model_joins_it(monkeypatch) -> None:
    monkeypatch.setattr(warmup, "_thread", None)
    first = warmup.start_warm_up()
    assert warmup.start_warm_up() is first
    assert first.name == "transformers-warm-up" and first.daemon
    opened = open_model("tiny-llama-demo")  # joins the warm-up before importing transformers
    assert not first.is_alive()
    assert "transformers" in sys.modules
    assert opened.model_class == "LlamaForCausalLM"


def test_waiting_without_a_warm_up_starts_none(monkeypatch) -> None:
    monkeypatch.setattr(warmup, "_thread", None)
    assert warmup.wait_for_warm_up() is None
    assert warmup._thread is None  # waiting never starts an import of its own


def test_the_warm_up_thread_itself_may_wait_without_joining_itself(monkeypatch) -> None:
    outcome: list[object] = []

    def body() -> None:
        try:
            warmup.wait_for_warm_up()  # a self-join would raise RuntimeError
            outcome.append("returned")
        except RuntimeError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=body, name="transformers-warm-up")
    monkeypatch.setattr(warmup, "_thread", thread)
    thread.start()
    thread.join()
    assert outcome == ["returned"]
