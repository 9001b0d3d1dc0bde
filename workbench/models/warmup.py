"""Import transformers before the first model open, on a background thread, without racing it.

Importing transformers and a model class takes seconds on a cold start. The GUI starts
``start_warm_up()`` when it opens with no model, so the import runs while the user picks one;
``open_model`` calls ``wait_for_warm_up()`` first, so a warm-up still running is joined rather
than raced (transformers' lazy module attributes are not safe to import from two threads at
once).
"""

from __future__ import annotations

import logging
import threading

__all__ = ["start_warm_up", "wait_for_warm_up"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_thread: threading.Thread | None = None


def start_warm_up() -> threading.Thread:
    """Start importing transformers (and the auto and Llama classes) once; return the thread."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_import, name="transformers-warm-up", daemon=True)
            _thread.start()
        return _thread


def wait_for_warm_up() -> None:
    """Block until a warm-up started earlier has finished; return at once if none was."""
    thread = _thread
    if thread is not None and thread is not threading.current_thread():
        thread.join()


def _import() -> None:
    try:
        import transformers  # noqa: PLC0415 (the warm-up imports it on a thread, on purpose)

        _ = (transformers.CONFIG_MAPPING, transformers.AutoModelForCausalLM)
        _ = (transformers.LlamaConfig, transformers.LlamaForCausalLM)  # the bundled demo's
    except Exception:  # the open that follows reports a broken transformers properly
        logger.debug("transformers warm-up failed", exc_info=True)
