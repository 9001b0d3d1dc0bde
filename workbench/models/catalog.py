"""The bundled ``config.json`` files of well-known models, for what-if planning without weights.

Each lives in ``resources/configs/<name>.json`` and is opened by name::

    >>> [entry.name for entry in list_bundled_configs()][:2]  # doctest: +SKIP
    ['bert-base-uncased', 'gpt2']
    >>> open_model("llama-3.1-70b")  # doctest: +SKIP
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from workbench.big_modeling.json_files import read_json
from workbench.models.errors import ModelSourceError
from workbench.models.hf_cache import HF_CACHE_PREFIX
from workbench.resources import resources_root

# Where each bundled config's weights live on the Hugging Face Hub (for ``plan --emit-code``).
HUB_REPO_IDS = {
    "bert-base-uncased": "google-bert/bert-base-uncased",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "gpt2": "openai-community/gpt2",
    "llama-3.1-405b": "meta-llama/Llama-3.1-405B",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
}


@dataclass(frozen=True)
class BundledConfig:
    """One bundled config: ``name`` (file stem), ``path``, ``model_type``, ``architecture``."""

    name: str
    path: Path
    model_type: str
    architecture: str


def configs_dir() -> Path:
    return resources_root() / "configs"


def list_bundled_configs() -> list[BundledConfig]:
    """Return the bundled configs, sorted by name."""
    entries = []
    for path in sorted(configs_dir().glob("*.json")):
        data = read_json(path, what="a bundled model config", fix="Reinstall the workbench.")
        if not isinstance(data, dict):
            continue
        architectures = data.get("architectures") or [""]
        entries.append(BundledConfig(path.stem, path, data.get("model_type", ""), architectures[0]))
    return entries


def is_bundled_name(name: str) -> bool:
    """True when ``name`` (with or without ``.json``) is a bundled config."""
    stem = name.removesuffix(".json")
    return bool(stem) and "/" not in stem and (configs_dir() / f"{stem}.json").is_file()


def hub_repo_id(source: str) -> str | None:
    """Return the Hugging Face Hub repo id of a model source, or ``None`` when it has none.

    Knows a bundled config by name (``"llama-3.1-70b"``) or by its file in
    ``resources/configs``, and an ``hf-cache:REPO_ID`` source. A local folder or any other
    config file has no repo id.

    Example:
        >>> hub_repo_id("llama-3.1-70b")
        'meta-llama/Llama-3.1-70B'
    """
    if source.startswith(HF_CACHE_PREFIX):
        return source.removeprefix(HF_CACHE_PREFIX) or None
    path = Path(source)
    if path.suffix == ".json" and path.is_file():
        if path.resolve().parent != configs_dir().resolve():
            return None
        return HUB_REPO_IDS.get(path.stem)
    if path.exists() or not is_bundled_name(source):
        return None
    return HUB_REPO_IDS.get(source.removesuffix(".json"))


def bundled_config_path(name: str) -> Path:
    """Return the path of the bundled config ``name``.

    Raises:
        ModelSourceError: unknown name, with the closest bundled names.
    """
    stem = name.removesuffix(".json")
    path = configs_dir() / f"{stem}.json"
    if "/" not in stem and path.is_file():
        return path
    names = [entry.name for entry in list_bundled_configs()]
    close = difflib.get_close_matches(stem, names, n=3, cutoff=0.4)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise ModelSourceError(
        f"{name!r} is not a file, folder or bundled config.{hint} Bundled: {', '.join(names)}"
    )
