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


def test_waiting_without_a_warm_up_returns_at_once(monkeypatch) -> None:
    monkeypatch.setattr(warmup, "_thread", None)
    warmup.wait_for_warm_up()
    monkeypatch.setattr(warmup, "_thread", threading.current_thread())
    warmup.wait_for_warm_up()  # called from the warm-up thread itself: no self-join
