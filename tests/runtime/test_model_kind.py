"""Which models generate tokens: the rule the run, the speed line and the fit table share."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from workbench.models.intake import open_model
from workbench.runtime.model_kind import generates_tokens, is_causal_lm


def test_transformers_says_which_models_generate() -> None:
    bert, gpt2, llama = (open_model(n) for n in ("bert-base-uncased", "gpt2", "llama-3.1-8b"))
    assert (bert.model_class, gpt2.model_class) == ("BertForMaskedLM", "GPT2LMHeadModel")
    assert not generates_tokens(bert) and not is_causal_lm(bert.model)
    assert generates_tokens(gpt2) and generates_tokens(llama)


def test_a_module_transformers_cannot_judge_keeps_generation_figures() -> None:
    with torch.device("meta"):
        plain = nn.Linear(4, 4)
    assert not is_causal_lm(plain)  # a run of it would be one forward ...
    assert generates_tokens(SimpleNamespace(model=plain))  # ... but no model class says so
    assert generates_tokens(SimpleNamespace(model=None)) and generates_tokens(None)
