"""The public surface of ``workbench.big_modeling`` matches the reference API exactly.

Expected signatures are copied by hand from ``../shared/reference/big_modeling_api.md`` (the
English restatement of the product owner's Spanish reference). For each name, the
positional-or-keyword parameters must have exactly these names, this order and these defaults;
extra keyword-only parameters (our extras, e.g. ``progress=``) are allowed, nothing else is.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import Any

import pytest

import workbench.big_modeling as engine

REQUIRED = object()  # marks a parameter without a default
VAR_ARGS = "*"  # prefix for *args in an expected list
VAR_KWARGS = "**"  # prefix for **kwargs

_ALIGN_KWARGS: list[tuple[str, Any]] = [
    ("module", REQUIRED),
    ("execution_device", None),
    ("offload", False),
    ("weights_map", None),
    ("offload_buffers", False),
    ("module_name", ""),
    ("skip_keys", None),
    ("preload_module_classes", None),
    ("tied_params_map", None),
]

REFERENCE_SIGNATURES: dict[str, list[tuple[str, Any]]] = {
    "init_empty_weights": [("include_buffers", None)],
    "init_on_device": [("device", REQUIRED), ("include_buffers", None)],
    "cpu_offload": [
        ("model", REQUIRED),
        ("execution_device", None),
        ("offload_buffers", False),
        ("state_dict", None),
        ("preload_module_classes", None),
    ],
    "cpu_offload_with_hook": [
        ("model", REQUIRED),
        ("execution_device", None),
        ("prev_module_hook", None),
    ],
    "disk_offload": [
        ("model", REQUIRED),
        ("offload_dir", REQUIRED),
        ("execution_device", None),
        ("offload_buffers", False),
        ("preload_module_classes", None),
    ],
    "dispatch_model": [
        ("model", REQUIRED),
        ("device_map", REQUIRED),
        ("main_device", None),
        ("state_dict", None),
        ("offload_dir", None),
        ("offload_index", None),
        ("offload_buffers", False),
        ("skip_keys", None),
        ("preload_module_classes", None),
        ("force_hooks", False),
    ],
    "load_checkpoint_and_dispatch": [
        ("model", REQUIRED),
        ("checkpoint", REQUIRED),
        ("device_map", None),
        ("max_memory", None),
        ("no_split_module_classes", None),
        ("offload_folder", None),
        ("offload_buffers", False),
        ("dtype", None),
        ("offload_state_dict", None),
        ("skip_keys", None),
        ("preload_module_classes", None),
        ("force_hooks", False),
        ("strict", False),
        ("full_state_dict", True),
        ("broadcast_from_rank0", False),
    ],
    "load_checkpoint_in_model": [
        ("model", REQUIRED),
        ("checkpoint", REQUIRED),
        ("device_map", None),
        ("offload_folder", None),
        ("dtype", None),
        ("offload_state_dict", False),
        ("offload_buffers", False),
        ("keep_in_fp32_modules", None),
        ("offload_8bit_bnb", False),
        ("strict", False),
        ("full_state_dict", True),
        ("broadcast_from_rank0", False),
    ],
    "infer_auto_device_map": [
        ("model", REQUIRED),
        ("max_memory", None),
        ("no_split_module_classes", None),
        ("dtype", None),
        ("special_dtypes", None),
        ("verbose", False),
        ("clean_result", True),
        ("offload_buffers", False),
        ("fallback_allocation", False),
    ],
    # classes: the constructor's parameters
    "ModelHook": [],
    "SequentialHook": [("*hooks", REQUIRED)],
    "AlignDevicesHook": [
        ("execution_device", None),
        ("offload", False),
        ("io_same_device", False),
        ("weights_map", None),
        ("offload_buffers", False),
        ("place_submodules", False),
        ("skip_keys", None),
        ("tied_params_map", None),
    ],
    "LayerwiseCastingHook": [
        ("storage_dtype", REQUIRED),
        ("compute_dtype", REQUIRED),
        ("non_blocking", REQUIRED),
    ],
    "add_hook_to_module": [("module", REQUIRED), ("hook", REQUIRED), ("append", False)],
    "remove_hook_from_module": [("module", REQUIRED), ("recurse", False)],
    "remove_hook_from_submodules": [("module", REQUIRED)],
    "attach_execution_device_hook": [
        ("module", REQUIRED),
        ("execution_device", REQUIRED),
        ("skip_keys", None),
        ("preload_module_classes", None),
        ("tied_params_map", None),
    ],
    "attach_align_device_hook": _ALIGN_KWARGS,
    "attach_align_device_hook_on_blocks": _ALIGN_KWARGS,
    "attach_layerwise_casting_hooks": [
        ("module", REQUIRED),
        ("storage_dtype", REQUIRED),
        ("compute_dtype", REQUIRED),
        ("skip_modules_pattern", None),
        ("skip_modules_classes", None),
        ("non_blocking", False),
    ],
    "has_offloaded_params": [("module", REQUIRED)],
    "align_module_device": [("module", REQUIRED), ("execution_device", None)],
    # Accelerate's offload utilities, promised in docs/contracts.md
    "OffloadedWeightsLoader": [
        ("state_dict", None),
        ("save_folder", None),
        ("index", None),
        ("device", None),
    ],
    "offload_state_dict": [("save_dir", REQUIRED), ("state_dict", REQUIRED)],
    "offload_weight": [
        ("weight", REQUIRED),
        ("weight_name", REQUIRED),
        ("offload_folder", REQUIRED),
        ("index", None),
    ],
    "load_offloaded_weight": [("weight_file", REQUIRED), ("weight_info", REQUIRED)],
}

HOOK_METHODS: dict[str, list[tuple[str, Any]]] = {
    "init_hook": [("module", REQUIRED)],
    "pre_forward": [("module", REQUIRED), ("*args", REQUIRED), ("**kwargs", REQUIRED)],
    "post_forward": [("module", REQUIRED), ("output", REQUIRED)],
    "detach_hook": [("module", REQUIRED)],
}


def _describe(signature: inspect.Signature) -> list[tuple[str, Any]]:
    """The signature as the test's expected lists spell it, keyword-only extras dropped."""
    described = []
    for parameter in signature.parameters.values():
        if parameter.kind is parameter.KEYWORD_ONLY:
            continue
        default = REQUIRED if parameter.default is parameter.empty else parameter.default
        if parameter.kind is parameter.VAR_POSITIONAL:
            described.append((f"{VAR_ARGS}{parameter.name}", REQUIRED))
        elif parameter.kind is parameter.VAR_KEYWORD:
            described.append((f"{VAR_KWARGS}{parameter.name}", REQUIRED))
        else:
            described.append((parameter.name, default))
    return described


def _resolve(name: str) -> Any:
    try:
        return getattr(engine, name)
    except (AttributeError, ImportError) as exc:
        pytest.fail(f"workbench.big_modeling.{name} does not resolve: {type(exc).__name__}: {exc}")


def _assert_matches(
    label: str, found: list[tuple[str, Any]], expected: list[tuple[str, Any]]
) -> None:
    def show(params: list[tuple[str, Any]]) -> str:
        return ", ".join(name if d is REQUIRED else f"{name}={d!r}" for name, d in params)

    assert [n for n, _ in found] == [n for n, _ in expected], (
        f"{label}: parameters ({show(found)}) differ from the reference ({show(expected)})"
    )
    for (name, default), (_, want) in zip(found, expected, strict=True):
        same = default is want if want is REQUIRED or default is REQUIRED else default == want
        assert same and type(default) is type(want), (
            f"{label}: parameter {name!r} defaults to {default!r}, the reference says {want!r}"
        )


@pytest.mark.parametrize("name", engine.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    value = _resolve(name)
    assert value is not None
    assert getattr(value, "__name__", name) == name  # no alias pointing at another object


@pytest.mark.parametrize("name", sorted(REFERENCE_SIGNATURES))
def test_reference_name_is_exported_with_its_exact_signature(name: str) -> None:
    assert name in engine.__all__, f"{name} is missing from workbench.big_modeling.__all__"
    value = _resolve(name)
    _assert_matches(name, _describe(inspect.signature(value)), REFERENCE_SIGNATURES[name])


@pytest.mark.parametrize("method", sorted(HOOK_METHODS))
def test_model_hook_methods_and_no_grad(method: str) -> None:
    hook_class = _resolve("ModelHook")
    assert hook_class.no_grad is False
    signature = inspect.signature(getattr(hook_class, method))
    found = [p for p in _describe(signature) if p[0] != "self"]
    _assert_matches(f"ModelHook.{method}", found, HOOK_METHODS[method])


def test_hook_classes_subclass_model_hook() -> None:
    base = _resolve("ModelHook")
    for name in ("SequentialHook", "AlignDevicesHook", "LayerwiseCastingHook"):
        assert issubclass(_resolve(name), base), name


def test_resolving_the_whole_surface_imports_no_qt() -> None:
    code = (
        "import sys, workbench.big_modeling as e\n"
        "failed = []\n"
        "for n in e.__all__:\n"
        "    try: getattr(e, n)\n"
        "    except Exception as exc: failed.append(n)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph', 'accelerate'))\n"
        "print('QT', ','.join(bad)); print('FAILED', ','.join(failed))\n"
        "sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, (
        f"engine pulled in Qt or accelerate: {result.stdout} {result.stderr}"
    )
