"""A small byte-level BPE tokenizer, trained offline on bundled text, for demo checkpoints.

Byte-level BPE encodes any text (no unknown tokens), so a demo model can run
``generate`` on whatever prompt a user types. Training on the same text with the same settings
gives the same vocabulary, so demo folders are reproducible byte for byte.

Example:
    >>> folder = save_demo_tokenizer("demo", arch="llama")  # doctest: +SKIP
    >>> AutoTokenizer.from_pretrained("demo")("hello").input_ids  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from workbench.big_modeling.atomic import atomic_write_text

DEMO_VOCAB_SIZE = 1024

# Plain English about the workbench itself: enough variety for a few hundred merges.
_CORPUS = """\
A model that is too big for one device can still run. Its layers are split between the GPU,
the CPU and the disk, and each layer's weights travel to the device that computes it just in
time. The workbench shows how many bytes each module holds, where the planner put it, and how
long every transfer takes. The planner fills the first GPU, then the next one, then the host
memory, and finally the disk. A block with residual connections is never split across devices.
Tied weights, such as an embedding shared with the output head, are placed once.
When a forward pass starts, the hooks move inputs to the execution device. Offloaded weights are
copied from pinned host memory on a side stream while the previous layer computes, so the copy
and the compute overlap. The time to first token depends on the prompt length; the time per
token depends on how many bytes must move for every forward pass.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How
vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow. The five boxing wizards
jump quickly. Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024 2048 4096 8192.
Once upon a time there was a small model that lived on a laptop. It dreamed of a bigger
machine with many GPUs, fast links and plenty of memory. One day a planner came by and said:
you do not need a bigger machine, you need a better plan. Together they measured every layer,
moved the heavy ones to the disk, kept the busy ones on the GPU, and the small model learned to
think a little faster every day. The end.
Memory, bandwidth and compute are the three budgets of inference. Bandwidth decides how fast
weights arrive; compute decides how fast they are used; memory decides what can stay.
"""


# A ChatML-like template over the demo's own special tokens: enough to exercise the chat path
# (system prompt, turns, the generation prompt, EOS as end of turn) without a real model.
DEMO_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ bos_token }}{{ message['role'] }}\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ bos_token }}assistant\n{% endif %}"
)


@dataclass(frozen=True)
class SpecialTokens:
    """The special tokens of a demo tokenizer for one architecture family."""

    bos: str
    eos: str
    pad: str
    unk: str | None = None
    extra: tuple[str, ...] = ()

    @property
    def all(self) -> list[str]:
        tokens = [self.pad, self.bos, self.eos, *([self.unk] if self.unk else []), *self.extra]
        return list(dict.fromkeys(tokens))


SPECIAL_TOKENS = {
    "llama": SpecialTokens(bos="<s>", eos="</s>", pad="<pad>"),
    "gpt2": SpecialTokens(bos="<|endoftext|>", eos="<|endoftext|>", pad="<|endoftext|>"),
    "bert": SpecialTokens(bos="[CLS]", eos="[SEP]", pad="[PAD]", unk="[UNK]", extra=("[MASK]",)),
}


def build_demo_tokenizer(arch: str = "llama", vocab_size: int = DEMO_VOCAB_SIZE):
    """Train and return a ``tokenizers.Tokenizer`` (byte-level BPE) for ``arch``."""
    from tokenizers import (  # noqa: PLC0415 (only when a demo tokenizer is trained)
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    special = SPECIAL_TOKENS[arch]
    tokenizer = Tokenizer(models.BPE(unk_token=special.unk))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        special_tokens=special.all,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)
    if arch == "bert":
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{special.bos} $A {special.eos}",
            pair=f"{special.bos} $A {special.eos} $B:1 {special.eos}:1",
            special_tokens=[
                (tok, tokenizer.token_to_id(tok)) for tok in (special.bos, special.eos)
            ],
        )
    elif arch == "llama":
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{special.bos} $A",
            pair=f"{special.bos} $A {special.bos} $B",
            special_tokens=[(special.bos, tokenizer.token_to_id(special.bos))],
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def save_demo_tokenizer(
    folder: str | os.PathLike[str],
    arch: str = "llama",
    vocab_size: int = DEMO_VOCAB_SIZE,
    *,
    chat_template: bool = False,
) -> dict[str, int]:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` into
    ``folder`` so ``AutoTokenizer.from_pretrained(folder)`` loads it. ``chat_template`` adds
    ``DEMO_CHAT_TEMPLATE`` (for testing the chat path; the random demo weights cannot chat).

    Returns:
        ``{"vocab_size": ..., "bos_token_id": ..., "eos_token_id": ..., "pad_token_id": ...}``
        for the model config.
    """
    out = Path(folder)
    special = SPECIAL_TOKENS[arch]
    tokenizer = build_demo_tokenizer(arch, vocab_size)
    atomic_write_text(out / "tokenizer.json", tokenizer.to_str(pretty=True))
    special_map = {"bos_token": special.bos, "eos_token": special.eos, "pad_token": special.pad}
    if special.unk:
        special_map["unk_token"] = special.unk
    if arch == "bert":
        special_map.update(cls_token=special.bos, sep_token=special.eos, mask_token="[MASK]")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 512,
        "padding_side": "left" if arch != "bert" else "right",
        "clean_up_tokenization_spaces": False,
        **special_map,
    }
    if chat_template:
        tokenizer_config["chat_template"] = DEMO_CHAT_TEMPLATE
    atomic_write_text(out / "tokenizer_config.json", _dumps(tokenizer_config))
    atomic_write_text(out / "special_tokens_map.json", _dumps(special_map))
    return {
        "vocab_size": tokenizer.get_vocab_size(),
        "bos_token_id": tokenizer.token_to_id(special.bos),
        "eos_token_id": tokenizer.token_to_id(special.eos),
        "pad_token_id": tokenizer.token_to_id(special.pad),
    }


def _dumps(data: dict[str, object]) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
