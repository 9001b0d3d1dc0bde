"""Models: open a config, folder or cached model as an empty-weight model with its module tree;
demo checkpoints; hardware profiles and the speed model. No Qt.

Names resolve lazily (PEP 562) so importing the package does not import transformers.
"""

from __future__ import annotations

from workbench._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "ModelSourceError": "errors",
    "ProfileError": "errors",
    "OpenedModel": "intake",
    "open_model": "intake",
    "resolve_source": "intake",
    "ModuleNode": "tree",
    "ModuleTree": "tree",
    "build_module_tree": "tree",
    "DeviceSpec": "hardware",
    "HardwareProfile": "hardware",
    "detect_hardware": "hardware",
    "list_profiles": "hardware",
    "load_profile": "hardware",
    "LayerPrediction": "speed",
    "SpeedPrediction": "speed",
    "predict_speed": "speed",
    "make_demo": "demo",
    "demo_model_dir": "demo",
    "real_demo_folder": "demo",
    "open_gguf": "intake",
    "read_gguf_header": "gguf",
    "convert_gguf": "gguf_convert",
    "list_bundled_configs": "catalog",
    "CachedModel": "hf_cache",
    "list_cached_models": "hf_cache",
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
