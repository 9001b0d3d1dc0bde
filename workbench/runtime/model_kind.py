"""Whether a model generates tokens: the one rule the run, the speed label and the fit table share.

A model that generates (``*ForCausalLM``, ``GPT2LMHeadModel``, an encoder-decoder whose class
can generate) is tested by decoding tokens, and its speed is tokens per second and time to
first token. Any other model (BERT as a masked LM, a classifier, a vision encoder) runs one
forward over its input and produces no tokens, so its only speed figure is that forward's
time; a tokens/s or TTFT for it would describe a run that never happens.

Example:
    >>> generates_tokens(opened_bert), generates_tokens(opened_llama)  # doctest: +SKIP
    (False, True)
"""

from __future__ import annotations

from typing import Any

__all__ = ["generates_tokens", "is_causal_lm"]


def is_causal_lm(model: Any) -> bool:
    """True for models that generate text (``*ForCausalLM`` and friends); works on an empty
    (meta) model, since only the class is asked."""
    name = type(model).__name__
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return True
    can_generate = getattr(model, "can_generate", None)
    try:
        return bool(can_generate()) if callable(can_generate) else False
    except Exception:
        return False


def generates_tokens(opened: Any) -> bool:
    """Whether an inference test of ``opened`` (an ``OpenedModel``) decodes tokens.

    ``False`` only when transformers says so (a ``PreTrainedModel`` whose ``can_generate()``
    is false and whose class is no causal LM); ``True`` when there is no model, or a module
    that is not a transformers model, to ask: the speed figures then stay tokens/s and TTFT.
    """
    model = getattr(opened, "model", None)
    if model is None or not callable(getattr(model, "can_generate", None)):
        return True
    return is_causal_lm(model)
