"""The engine, models and runtime never import Qt; only the GUI does."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "package",
    ["workbench.big_modeling", "workbench.models", "workbench.runtime", "workbench.cli"],
)
def test_package_does_not_import_qt(package: str) -> None:
    code = (
        f"import sys, {package}; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph', 'shiboken6')); "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"{package} imported Qt modules: {result.stdout} {result.stderr}"
