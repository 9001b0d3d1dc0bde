"""A pytest plugin that runs Accelerate's own tests against ``workbench.big_modeling``.

Loaded with ``-p reference_shim`` in a child pytest (see ``test_reference_suite.py``). It puts a
meta path finder first on ``sys.meta_path`` so every ``accelerate.*`` import resolves to a
module whose attributes come from our engine:

- ``accelerate.utils*`` names from ``workbench.big_modeling.utils`` (which mirrors
  ``accelerate.utils``), then ``workbench.big_modeling``;
- every other ``accelerate.*`` name from ``workbench.big_modeling``;
- the test-environment helpers the reference's tests import (``torch_device``, ``require_*``,
  ``slow``, ``is_torch_version``, ...) from ``TEST_SUPPORT`` below: they describe this machine,
  not the API.

A name we do not have resolves to a ``MissingName`` placeholder, so the module still imports;
a test that touches it is reported as ``missing`` (not failed, not an import error). Tests
outside the big-model API are listed once in ``OUT_OF_SCOPE`` with the reason and skipped.

With ``WORKBENCH_CONFORMANCE_REPORT=PATH`` the outcome of every test is written there as JSON
(``{nodeid: "passed" | "failed" | "missing" | "skipped"}``, plus ``missing_names``).
"""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import types
import unittest
from typing import Any

import pytest
import torch
from packaging import version as _version

PACKAGE = "accelerate"
ENGINE = "workbench.big_modeling"
ENGINE_UTILS = "workbench.big_modeling.utils"

# nodeid suffix -> why it is not part of the big-model API contract.
OUT_OF_SCOPE: dict[str, str] = {
    "test_big_modeling.py::RefuseRecurrentLayersTester::": (
        "sequence parallelism (distributed training), outside the big-model API"
    ),
    "test_modeling_utils.py::ModelingUtilsTester::test_extract_model_from_parallel": (
        "unwrapping DDP/compiled training models, outside the big-model API"
    ),
}


class MissingReferenceName(NotImplementedError):
    """A test used a name the reference has and ``workbench.big_modeling`` does not."""


class MissingName:
    """Stands in for a reference name we lack; any use raises ``MissingReferenceName``."""

    def __init__(self, qualified_name: str) -> None:
        object.__setattr__(self, "_qualified_name", qualified_name)

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        qualified_name = object.__getattribute__(self, "_qualified_name")
        MISSING_USED.add(qualified_name)
        raise MissingReferenceName(qualified_name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Used as a decorator at import time: the decorated tests become "missing" when run.
        if len(args) == 1 and not kwargs and isinstance(args[0], type | types.FunctionType):
            return self._decorate(args[0])
        return self._fail()

    def _decorate(self, target: Any) -> Any:
        if isinstance(target, type):
            for attr, value in list(vars(target).items()):
                if attr.startswith("test") and callable(value):
                    setattr(target, attr, self._decorate(value))
            return target

        @functools.wraps(target)
        def uses_missing_name(*args: Any, **kwargs: Any) -> Any:
            return self._fail()

        return uses_missing_name

    __iter__ = _fail
    __instancecheck__ = _fail  # isinstance(x, MISSING_TUPLE_OF_CLASSES)
    __subclasscheck__ = _fail
    __enter__ = _fail
    __getitem__ = _fail

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._fail()

    def __repr__(self) -> str:
        return f"<missing {object.__getattribute__(self, '_qualified_name')}>"


MISSING_USED: set[str] = set()


# --- test-environment support (describes this machine; not part of the API under test) ---


def _accelerator_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _skip_unless(condition: bool, reason: str):
    def decorator(test_case):
        return unittest.skipUnless(condition, reason)(test_case)

    return decorator


def _importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _require_torch_min_version(test_case=None, version: str | None = None):
    if test_case is None:
        return functools.partial(_require_torch_min_version, version=version)
    ok = _version.parse(torch.__version__) >= _version.parse(version or "0")
    return unittest.skipUnless(ok, f"test requires torch version >= {version}")(test_case)


def _is_torch_version(operation: str, wanted: str) -> bool:
    import operator

    ops = {">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne}
    ops |= {"<": operator.lt, "<=": operator.le}
    current = _version.parse(_version.parse(torch.__version__).base_version)
    return ops[operation](current, _version.parse(wanted))


def _clear_device_cache(garbage_collection: bool = False) -> None:
    if garbage_collection:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class RegressionModel(torch.nn.Module):
    """``accelerate.test_utils.training.RegressionModel``: ``y = a * x + b``."""

    def __init__(self, a: float = 0, b: float = 0, double_output: bool = False) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(a).float())
        self.b = torch.nn.Parameter(torch.tensor(b).float())
        self.double_output = double_output

    def forward(self, x: torch.Tensor | None = None) -> Any:
        y = x * self.a + self.b
        return (y, y) if self.double_output else y


class PartialState:
    """``accelerate.state.PartialState``: the reference's tests create one so its logging
    works; a single process needs nothing."""

    num_processes = 1
    process_index = 0
    local_process_index = 0
    is_main_process = True
    is_local_main_process = True


_GPU = _accelerator_count() > 0
TEST_SUPPORT: dict[str, Any] = {
    "torch_device": "cuda" if _GPU else "cpu",
    "slow": _skip_unless(os.environ.get("RUN_SLOW", "") not in ("", "0"), "test is slow"),
    "require_non_cpu": _skip_unless(_GPU, "test requires a GPU"),
    "require_cuda": _skip_unless(_GPU, "test requires a GPU"),
    "require_cuda_or_xpu": _skip_unless(_GPU, "test requires a CUDA GPU or XPU"),
    "require_multi_device": _skip_unless(
        _accelerator_count() > 1, "test requires multiple hardware accelerators"
    ),
    "require_multi_gpu": _skip_unless(_accelerator_count() > 1, "test requires multiple GPUs"),
    "require_multi_gpu_or_xpu": _skip_unless(
        _accelerator_count() > 1, "test requires multiple GPUs or XPUs"
    ),
    "require_non_hpu": _skip_unless(True, ""),
    "require_non_torch_xla": _skip_unless(True, ""),
    "require_tpu": _skip_unless(False, "test requires TPU"),
    "require_triton": _skip_unless(_importable("triton"), "test requires triton"),
    "require_bnb": _skip_unless(_importable("bitsandbytes"), "test requires bitsandbytes"),
    "require_huggingface_suite": _skip_unless(
        _importable("transformers") and _importable("datasets"),
        "test requires the Hugging Face suite",
    ),
    "require_torch_min_version": _require_torch_min_version,
    "is_torch_version": _is_torch_version,
    "is_xpu_available": lambda *args, **kwargs: False,
    "is_hpu_available": lambda *args, **kwargs: False,
    "is_mlu_available": lambda *args, **kwargs: False,
    "is_npu_available": lambda *args, **kwargs: False,
    "is_torch_xla_available": lambda *args, **kwargs: False,
    "clear_device_cache": _clear_device_cache,
    "RegressionModel": RegressionModel,
    "PartialState": PartialState,
}


class ShimModule(types.ModuleType):
    """``accelerate.X``: attributes resolved from the engine on first use."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _resolve(self.__name__, name)
        setattr(self, name, value)
        return value


def _resolve(module_name: str, name: str) -> Any:
    if name in TEST_SUPPORT:
        return TEST_SUPPORT[name]
    sources = [ENGINE]
    if module_name == f"{PACKAGE}.utils" or module_name.startswith(f"{PACKAGE}.utils."):
        sources.insert(0, ENGINE_UTILS)
    for source in sources:
        try:
            module = importlib.import_module(source)
        except ModuleNotFoundError:
            continue
        if name in getattr(module, "__all__", ()) or name in vars(module):
            return getattr(module, name)
    return MissingName(f"{module_name}.{name}")


class ShimFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds every ``accelerate`` module (before any installed ``accelerate``)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None):
        if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = ShimModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # the reference's version, bare: transformers parses it when accelerate is not installed
        module.__version__ = "1.15.0"


def install() -> None:
    """Put the finder first and forget any ``accelerate`` already imported."""
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
        del sys.modules[name]
    sys.meta_path.insert(0, ShimFinder())


# WORKBENCH_CONFORMANCE_AGAINST=accelerate runs the same tests on the installed reference, to
# record which of them pass there (tests/conformance/reference_passing.txt).
if os.environ.get("WORKBENCH_CONFORMANCE_AGAINST", "workbench") != "accelerate":
    install()

_OUTCOMES: dict[str, str] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for suffix, reason in OUT_OF_SCOPE.items():
            if suffix in item.nodeid:
                item.add_marker(pytest.mark.skip(reason=f"out of scope: {reason}"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if call.excinfo is not None and call.excinfo.errisinstance(MissingReferenceName):
        report.missing_name = str(call.excinfo.value)
    return report


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    if getattr(report, "missing_name", None) and report.failed:
        return "missing", "M", ("MISSING", {"yellow": True})
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if getattr(report, "missing_name", None) and report.failed:
        _OUTCOMES[report.nodeid] = "missing"
    elif (report.when == "call" or report.outcome != "passed") and _OUTCOMES.get(
        report.nodeid
    ) not in ("failed", "missing"):
        _OUTCOMES[report.nodeid] = report.outcome


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("WORKBENCH_CONFORMANCE_REPORT")
    if path:
        with open(path, "w", encoding="utf-8") as file:
            json.dump(
                {"outcomes": _OUTCOMES, "missing_names": sorted(MISSING_USED)}, file, indent=1
            )
