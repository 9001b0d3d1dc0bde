"""Open a model from what the user has: a ``config.json``, a Hugging Face-format folder, a model
in the local Hugging Face cache (``hf-cache:org/name``), a bundled config by name
(``llama-3.1-70b``) or a ``.gguf`` file (for planning; ``open_gguf``). Never touches the
network.

The model is built by transformers under our ``init_empty_weights``, so it costs no RAM for
weights. When the folder holds weights, sizes and dtypes come from the checkpoint's headers.

Example:
    >>> opened = open_model("llama-3.1-70b", dtype="float16")  # doctest: +SKIP
    >>> opened.tree.root.param_count, opened.no_split_modules
    (70553706496, ['LlamaDecoderLayer'])
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from workbench.big_modeling.dtypes import parse_dtype
from workbench.big_modeling.empty_init import init_empty_weights, skip_on_meta
from workbench.big_modeling.json_files import read_json
from workbench.big_modeling.loading.index import CheckpointIndex
from workbench.models.catalog import bundled_config_path, is_bundled_name
from workbench.models.config_checks import check_config_structure
from workbench.models.errors import ModelSourceError
from workbench.models.gguf import (
    CONVERTED_DTYPE,
    gguf_config_dict,
    gguf_to_hf_names,
    is_gguf_path,
    read_gguf_header,
)
from workbench.models.hf_cache import HF_CACHE_PREFIX, resolve_cached_model
from workbench.models.tree import ModuleTree, build_module_tree
from workbench.models.warmup import wait_for_warm_up

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
# Fields that fix a model's size; transformers fills defaults silently, which would describe a
# different model, so a config.json must state each one its config class defines with a
# default (or its alias, e.g. GPT-2's n_embd). A field whose default is None is derived from the
# others (GPT-2's n_inner = 4 * n_embd), so leaving it out is normal.
REQUIRED_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "vocab_size",
    "intermediate_size",
    "num_attention_heads",
    "num_local_experts",
    "num_experts",
    "moe_intermediate_size",
)
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
# What ``open_model(progress=...)`` reports, in order.
OPEN_STAGES = (
    "reading config",
    "building empty model",
    "reading checkpoint headers",
    "building module tree",
)


@dataclass
class OpenedModel:
    """A model opened for planning: its config, empty-weight module and tree.

    Attributes:
        source: what the user gave (path, ``hf-cache:...`` or bundled name).
        config: the transformers ``PretrainedConfig``.
        model: the module with ``meta`` weights (buffers real).
        checkpoint: the header-only index of the weights, or ``None`` without weights.
        no_split_modules: class names that must stay on one device, sorted.
        tied_groups: tensor names sharing one tensor (each group sorted).
        declared_dtype: the config's ``dtype``/``torch_dtype``, or ``None``.
        tree: the module tree, bytes in ``planning_dtype``.
        tokenizer_dir: the folder holding tokenizer files, or ``None``.
        folder: the model folder, or ``None`` for a bare config.
        config_path: the ``config.json`` read.
        model_class: the transformers class built (``"LlamaForCausalLM"``).
        planning_dtype: the dtype the tree counts floating weights in (``None`` = as stored).
        tied_weight_keys: tensor names that share another tensor in the built model (the
            later name of each tied group, e.g. GPT-2's ``lm_head.weight``), sorted; empty for
            an untied model even when its class declares ``_tied_weights_keys``.
        missing_keys: model tensors the checkpoint lacks (tied aliases and non-persistent
            buffers excluded), sorted.
        unexpected_keys: checkpoint tensors the model does not have, sorted.
        build_s: seconds spent building the empty model.
        gguf: the ``GGUFHeader`` when the source is a ``.gguf`` file (planning only: convert
            it with ``workbench.models.gguf_convert.convert_gguf`` to load it), else ``None``.
        gguf_nbytes: bytes each tensor takes in the GGUF file, by state-dict name.
    """

    source: str
    config: Any
    model: torch.nn.Module
    checkpoint: Any
    no_split_modules: list[str]
    tied_groups: list[list[str]]
    declared_dtype: torch.dtype | None
    tree: ModuleTree
    tokenizer_dir: Path | None = None
    folder: Path | None = None
    config_path: Path | None = None
    model_class: str = ""
    planning_dtype: torch.dtype | None = None
    tied_weight_keys: list[str] = field(default_factory=list)
    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)
    build_s: float = 0.0
    gguf: Any = None
    gguf_nbytes: dict[str, int] | None = None

    @property
    def has_weights(self) -> bool:
        return self.checkpoint is not None

    @property
    def label(self) -> str:
        """A short name for titles: the folder or config stem."""
        if self.folder is not None:
            return self.folder.name
        return Path(self.source).name.removesuffix(".json").removesuffix(".gguf")

    def with_dtype(self, dtype: str | torch.dtype | None) -> OpenedModel:
        """Return a copy whose tree counts floating weights in ``dtype`` (same model object)."""
        planning = parse_dtype(dtype)
        if self.gguf_nbytes is not None:  # GGUF bytes are not a torch dtype's: plan converted
            planning = planning or self.declared_dtype
        return replace(
            self,
            tree=_tree_for(
                self.model, self.checkpoint, planning, self.no_split_modules, self.gguf_nbytes
            ),
            planning_dtype=planning,
        )

    def module_sizes(self, dtype: str | torch.dtype | None = None) -> dict[str, int]:
        """Return the bytes to plan with per module and tensor name (``""`` = total).

        Exactly what the tree reports: checkpoint header sizes when the folder holds weights
        (a mixed fp32/fp16 checkpoint counts each tensor as stored), else the config's dtype.
        Pass it as ``module_sizes=`` to the planner so the plan and the tree agree.

        Args:
            dtype: count floating weights in this dtype instead; ``None`` keeps the tree's
                ``planning_dtype``.

        Example:
            >>> opened = open_model("demo")  # doctest: +SKIP
            >>> opened.module_sizes()[""] == opened.tree.root.nbytes
            True
        """
        planning = parse_dtype(dtype)
        if planning is None or planning == self.planning_dtype:
            return self.tree.module_sizes()
        return self.with_dtype(planning).tree.module_sizes()


def resolve_source(source: str | os.PathLike[str]) -> tuple[Path, Path | None]:
    """Return ``(config_path, folder)`` for a source; ``folder`` is ``None`` for a bare config.

    Raises:
        ModelSourceError: a folder without ``config.json``, a file that is not JSON, or a name
            that is neither a path, a bundled config nor a cached repo.
    """
    text = os.fspath(source)
    if text.startswith(HF_CACHE_PREFIX):
        folder = resolve_cached_model(text)
        return folder / CONFIG_NAME, folder
    path = Path(text).expanduser()
    if path.is_dir():
        config_path = path / CONFIG_NAME
        if not config_path.is_file():
            present = sorted(p.name for p in path.iterdir())[:8]
            raise ModelSourceError(
                f"folder {path} has no {CONFIG_NAME} (it holds: {', '.join(present) or 'nothing'}); "
                "open a Hugging Face-format folder or a config.json file"
            )
        return config_path, path
    if path.is_file():
        if path.suffix in WEIGHT_SUFFIXES:
            raise ModelSourceError(
                f"{path} is a weights file; open the folder holding it and its {CONFIG_NAME}"
            )
        if path.name == CONFIG_NAME and _has_weights(path.parent):
            return path, path.parent
        return path, None
    if is_bundled_name(text):
        return bundled_config_path(text), None
    if _REPO_ID.match(text) and not text.startswith("."):
        try:
            folder = resolve_cached_model(text)
        except ModelSourceError:
            pass
        else:
            return folder / CONFIG_NAME, folder
    # Raises with the closest bundled names.
    return bundled_config_path(text), None


def open_model(
    source: str | os.PathLike[str],
    *,
    dtype: str | torch.dtype | None = None,
    progress: Callable[[str], None] | None = None,
) -> OpenedModel:
    """Open ``source`` as an empty-weight model with its tree (see the module docs).

    Args:
        source: a ``config.json``, a model folder, ``hf-cache:org/name`` or a bundled name.
        dtype: planning dtype for floating weights; ``None`` counts them as stored (or as
            declared when there are no weights).
        progress: called with each stage of ``OPEN_STAGES`` as it starts (a folder without
            weights skips ``"reading checkpoint headers"``).

    Returns:
        An ``OpenedModel``.

    Raises:
        ModelSourceError: no config, malformed config, unknown ``model_type``, missing required
            fields, or transformers failing to build the class (named).
        CheckpointError: a corrupt or incomplete checkpoint in the folder.
    """
    if is_gguf_path(source) and not Path(source).expanduser().is_dir():
        return open_gguf(Path(source).expanduser(), dtype=dtype, progress=progress)
    stage = progress or (lambda _: None)
    planning = parse_dtype(dtype)
    stage(OPEN_STAGES[0])
    config_path, folder = resolve_source(source)
    data = read_config(config_path)
    wait_for_warm_up()  # never import transformers alongside a warm-up thread
    config = build_config(data, config_path)
    declared = declared_dtype(config)
    stage(OPEN_STAGES[1])
    start = time.perf_counter()
    model, class_name = build_empty_model(config, config_path)
    build_s = time.perf_counter() - start
    checkpoint = None
    if folder is not None and _has_weights(folder):
        stage(OPEN_STAGES[2])
        checkpoint = CheckpointIndex.from_path(folder)
    no_split = sorted(getattr(model, "_no_split_modules", None) or [])
    stage(OPEN_STAGES[3])
    tree = _tree_for(model, checkpoint, planning, no_split)
    missing, unexpected = _compare_keys(model, tree, checkpoint)
    if missing or unexpected:
        logger.warning(
            "%s: checkpoint and model differ: %d missing, %d unexpected tensors",
            folder,
            len(missing),
            len(unexpected),
        )
    return OpenedModel(
        source=os.fspath(source),
        config=config,
        model=model,
        checkpoint=checkpoint,
        no_split_modules=no_split,
        tied_groups=tree.tied_groups,
        declared_dtype=declared,
        tree=tree,
        tokenizer_dir=folder if folder is not None and _has_tokenizer(folder) else None,
        folder=folder,
        config_path=config_path,
        model_class=class_name,
        planning_dtype=planning,
        tied_weight_keys=_tied_aliases(tree),
        missing_keys=missing,
        unexpected_keys=unexpected,
        build_s=build_s,
    )


def open_gguf(
    path: str | os.PathLike[str],
    *,
    dtype: str | torch.dtype | None = None,
    progress: Callable[[str], None] | None = None,
) -> Any:
    """Open a ``.gguf`` file as an empty-weight model for planning.

    The tree counts each tensor's GGUF bytes as ``stored_nbytes`` and the bytes once converted
    to a torch dtype (``bfloat16`` by default) as ``nbytes``, so planning works from the header
    alone. Loading needs the file converted first
    (``workbench.models.gguf_convert.convert_gguf``; the load job does it).

    Args:
        path: the GGUF file.
        dtype: the torch dtype planning counts floating weights in; ``None`` means the dtype
            the conversion writes (``bfloat16``).
        progress: called with each stage of ``OPEN_STAGES`` as it starts.

    Returns:
        An ``OpenedModel`` with ``gguf`` set to the header, ``checkpoint`` ``None`` (the file
        is not loadable as it is) and a tree whose ``stored_nbytes`` are the GGUF's bytes.

    Raises:
        ModelSourceError: not a GGUF, a corrupt header, or an architecture transformers
            cannot convert.

    Example:
        >>> opened = open_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP
        >>> opened.tree.root.stored_nbytes, opened.tree.root.nbytes  # Q4_1/Q8_0 file, bf16 model
        (96577024, 269030144)
    """
    stage = progress or (lambda _: None)
    planning = parse_dtype(dtype) or CONVERTED_DTYPE
    stage(OPEN_STAGES[0])
    header = read_gguf_header(path)
    data = gguf_config_dict(header, planning if planning.is_floating_point else CONVERTED_DTYPE)
    wait_for_warm_up()
    config = build_config(data, header.path)
    stage(OPEN_STAGES[1])
    start = time.perf_counter()
    model, class_name = build_empty_model(config, header.path)
    build_s = time.perf_counter() - start
    stage(OPEN_STAGES[3])
    names = gguf_to_hf_names(model, header)
    by_name = {t.name: t for t in header.tensors}
    stored = {hf: by_name[g].stored_nbytes for g, hf in names.items()}
    no_split = sorted(getattr(model, "_no_split_modules", None) or [])
    tree = _tree_for(model, None, planning, no_split, stored)
    unmapped = sorted(set(by_name) - set(names))
    if unmapped:
        logger.warning(
            "%s: %d GGUF tensors have no place in %s: %s",
            header.path,
            len(unmapped),
            class_name,
            ", ".join(unmapped[:5]),
        )
    tied = {name for group in tree.tied_groups for name in group}
    expected = set(model.state_dict(keep_vars=True))
    missing = sorted(name for name in expected - set(stored) if name not in tied)
    return OpenedModel(
        source=os.fspath(path),
        config=config,
        model=model,
        checkpoint=None,
        no_split_modules=no_split,
        tied_groups=tree.tied_groups,
        declared_dtype=planning,
        tree=tree,
        config_path=None,
        model_class=class_name,
        planning_dtype=planning,
        tied_weight_keys=_tied_aliases(tree),
        missing_keys=missing,
        unexpected_keys=unmapped,
        build_s=build_s,
        gguf=header,
        gguf_nbytes=stored,
    )


def read_config(config_path: Path) -> dict[str, Any]:
    """Return the JSON object in ``config_path``.

    Raises:
        ModelSourceError: unreadable file, not UTF-8 (with the byte and its offset), invalid
            JSON (with line and column), not an object.
    """
    try:
        data = read_json(
            config_path,
            what="a model config (JSON text, as transformers' save_pretrained writes it)",
            fix="Fix the file or download the model's config.json again.",
            error=ModelSourceError,
            max_nbytes=16 * 2**20,  # the largest real configs are ~100 KB
        )
    except FileNotFoundError:
        raise ModelSourceError(f"{config_path}: no such file") from None
    if not isinstance(data, dict):
        raise ModelSourceError(
            f"{config_path} must hold a JSON object, found {type(data).__name__}"
        )
    return data


def build_config(data: dict[str, Any], config_path: Path) -> Any:
    """Return the transformers config for ``data`` (read from ``config_path``).

    Raises:
        ModelSourceError: no or unknown ``model_type`` (with close names), missing required
            fields, or values transformers rejects.
    """
    from transformers import CONFIG_MAPPING  # noqa: PLC0415 (transformers is heavy)

    model_type = data.get("model_type")
    if not model_type:
        raise ModelSourceError(
            f'{config_path} has no \'model_type\'; add the model family, e.g. "model_type": "llama"'
        )
    if model_type not in CONFIG_MAPPING:
        known = list(CONFIG_MAPPING.keys())
        close = difflib.get_close_matches(str(model_type), known, n=5, cutoff=0.6)
        hint = f"; close names transformers knows: {', '.join(close)}" if close else ""
        raise ModelSourceError(
            f"{config_path}: model_type {model_type!r} is unknown to transformers"
            f"{hint}. Fix 'model_type' or upgrade transformers."
        )
    config_class = CONFIG_MAPPING[model_type]
    missing = _missing_required(data, config_class)
    if missing:
        raise ModelSourceError(
            f"{config_path} is missing required fields for {model_type}: {', '.join(missing)}; "
            "without them transformers would use defaults that describe another model"
        )
    try:
        config = config_class.from_dict(data)
    except Exception as exc:
        raise ModelSourceError(
            f"{config_path}: transformers rejects this {model_type} config: {exc}"
        ) from exc
    config._name_or_path = str(config_path.parent)
    check_config_structure(config, config_path)  # hidden_size 0, -3 layers, 10**12 layers
    return config


@contextlib.contextmanager
def _transformers_init_skips_meta() -> Iterator[None]:
    """transformers keeps its own references to the ``torch.nn.init`` functions
    (``transformers.initialization.TORCH_INIT_FUNCTIONS``), out of reach of the engine's
    meta skip; without this, initialising meta weights is ~80% of building a 405B model.
    (``no_init_weights`` would also skip weight tying, which the tree reports.)"""
    try:
        from transformers import initialization  # noqa: PLC0415 (transformers is heavy)
    except ImportError:  # older transformers call torch.nn.init directly
        yield
        return
    table = getattr(initialization, "TORCH_INIT_FUNCTIONS", None)
    if not isinstance(table, dict):
        yield
        return
    saved = dict(table)
    table.update({name: skip_on_meta(function) for name, function in saved.items()})
    try:
        yield
    finally:
        table.clear()
        table.update(saved)


def build_empty_model(config: Any, config_path: Path | None = None) -> tuple[torch.nn.Module, str]:
    """Build the model class of ``config`` with meta weights; return it and its class name.

    The class is ``config.architectures[0]`` when transformers has it, else the
    ``AutoModelForCausalLM`` mapping, else ``AutoModel``.

    Raises:
        ModelSourceError: naming the class transformers could not build and why.
    """
    import transformers  # noqa: PLC0415 (transformers is heavy)

    architectures = getattr(config, "architectures", None) or []
    candidates: list[Any] = []
    for name in architectures[:1]:
        cls = getattr(transformers, name, None)
        if cls is None:
            logger.warning(
                "%s: transformers has no class %s; using the auto class", config_path, name
            )
        else:
            candidates.append(cls)
    candidates += [transformers.AutoModelForCausalLM, transformers.AutoModel]
    errors: list[str] = []
    build_dtype = declared_dtype(config) or torch.float32
    if not build_dtype.is_floating_point:
        build_dtype = torch.float32
    for cls in candidates:
        is_auto = cls.__name__.startswith("Auto")
        try:
            with init_empty_weights(), _transformers_init_skips_meta():
                if is_auto:
                    model = cls.from_config(config, dtype=build_dtype)
                else:
                    model = cls._from_config(config, dtype=build_dtype)
        except Exception as exc:
            errors.append(f"{cls.__name__}: {type(exc).__name__}: {exc}")
            if not is_auto:
                break  # the named architecture failed: report it rather than guess
            continue
        return model.eval(), type(model).__name__
    where = f" from {config_path}" if config_path else ""
    raise ModelSourceError(f"transformers could not build the model{where}: " + " | ".join(errors))


def declared_dtype(config: Any) -> torch.dtype | None:
    """Return the dtype the config declares (``dtype`` or ``torch_dtype``), or ``None``."""
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    try:
        return parse_dtype(value) if value is not None else None
    except ValueError:
        return None


def _missing_required(data: dict[str, Any], config_class: Any) -> list[str]:
    if getattr(config_class, "sub_configs", None):
        return []  # composite configs (vision-language) keep sizes in sub-configs
    aliases = getattr(config_class, "attribute_map", {}) or {}
    try:
        defaults = config_class()
    except Exception:
        return []
    missing = []
    reported: set[str] = set()
    for name in REQUIRED_FIELDS:
        if name in reported or getattr(defaults, name, None) is None:
            continue
        # attribute_map maps a JSON key to the attribute that stores it, in either direction
        # (GPT-2's hidden_size -> n_embd; Mixtral's num_experts -> num_local_experts)
        same = [name, *(a for a, b in aliases.items() if name in (a, b) and a != name)]
        same += [b for a, b in aliases.items() if a == name and b not in same]
        reported.update(same)
        if any(key in data for key in same):
            continue
        missing.append(f"{name} (or {', '.join(same[1:])})" if len(same) > 1 else name)
    return sorted(missing)


def _tree_for(
    model: torch.nn.Module,
    checkpoint: Any,
    planning: torch.dtype | None,
    no_split: list[str],
    gguf_nbytes: dict[str, int] | None = None,
) -> ModuleTree:
    stored_nbytes, stored_dtypes = gguf_nbytes, None
    if checkpoint is not None:
        stored_nbytes = {name: info.nbytes for name, info in checkpoint.tensors.items()}
        stored_dtypes = {name: info.dtype for name, info in checkpoint.tensors.items()}
    return build_module_tree(
        model,
        dtype=planning,
        stored_nbytes=stored_nbytes,
        stored_dtypes=stored_dtypes,
        no_split_classes=no_split,
    )


def _tied_aliases(tree: ModuleTree) -> list[str]:
    """The names of each tied group other than the one the tree counts the tensor under."""
    return sorted(
        name for group in tree.tied_groups for name in group if name not in tree.tensor_nbytes
    )


def _compare_keys(
    model: torch.nn.Module, tree: ModuleTree, checkpoint: Any
) -> tuple[list[str], list[str]]:
    if checkpoint is None:
        return [], []
    expected = set(model.state_dict(keep_vars=True).keys())
    in_checkpoint = set(checkpoint.tensors)
    tied_aliases = {name for group in tree.tied_groups for name in group}
    missing = sorted(name for name in expected - in_checkpoint if name not in tied_aliases)
    unexpected = sorted(in_checkpoint - expected)
    return missing, unexpected


def _has_weights(folder: Path) -> bool:
    return any(
        entry.suffix in WEIGHT_SUFFIXES or entry.name.endswith(".index.json")
        for entry in folder.iterdir()
        if entry.is_file()
    )


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)
