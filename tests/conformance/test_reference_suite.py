"""The reference's own tests, run against ``workbench.big_modeling`` (issue 15).

Fetches the ``accelerate==1.15.0`` source distribution (``pip download --no-binary :all:
--no-deps``) into a cache that is never committed (``$WORKBENCH_CONFORMANCE_CACHE``, default
``~/.cache/model-memory-workbench/conformance``), then runs its big-model tests in a child pytest
with ``reference_shim`` loaded, which makes every ``accelerate.*`` import resolve to our engine.
Every test that passes on the real ``accelerate`` 1.15.0 on CPU (``reference_passing.txt``)
must pass on ours; the counts (passed / failed / missing / skipped) are printed in the terminal
summary. Skipped, with the reason, only when the source distribution cannot be fetched.

To refresh ``reference_passing.txt``: install ``accelerate==1.15.0`` and run the child command
below with ``WORKBENCH_CONFORMANCE_AGAINST=accelerate``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.conformance, pytest.mark.slow]

VERSION = "1.15.0"
HERE = Path(__file__).resolve().parent
REFERENCE_FILES = [
    "tests/test_big_modeling.py",
    "tests/test_hooks.py",
    "tests/test_modeling_utils.py",
    "tests/test_offload.py",
    "tests/test_utils.py::UtilsTester::test_has_offloaded_params",
]


def _cache_dir() -> Path:
    configured = os.environ.get("WORKBENCH_CONFORMANCE_CACHE")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "model-memory-workbench" / "conformance"


def _fetch_reference() -> Path:
    """The extracted source tree of accelerate 1.15.0 (downloaded once, then cached)."""
    cache = _cache_dir()
    tree = cache / f"accelerate-{VERSION}"
    if all((tree / name.split("::")[0]).is_file() for name in REFERENCE_FILES):
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"accelerate-{VERSION}.tar.gz"
    if not archive.is_file():
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:"]
        command += ["--no-deps", f"accelerate=={VERSION}", "-d", str(cache)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            pytest.skip(f"could not fetch the accelerate=={VERSION} sdist: pip download timed out")
        if done.returncode != 0 or not archive.is_file():
            reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            pytest.skip(f"could not fetch the accelerate=={VERSION} sdist: {reason[0]}")
    with tarfile.open(archive) as sdist:
        members = [m for m in sdist.getmembers() if m.name.startswith(f"{tree.name}/tests/")]
        sdist.extractall(cache, members=members, filter="data")
    return tree


def _run_reference_tests(tree: Path, report: Path, ini: Path) -> subprocess.CompletedProcess:
    ini.write_text("[pytest]\n", encoding="utf-8")  # not our pyproject's settings
    env = dict(os.environ)
    # Distribution metadata for the shim: transformers asks importlib.metadata for
    # accelerate's version once it can import `accelerate`, which fails where the real one is
    # not installed (a fresh machine).
    metadata = ini.parent / "shim-metadata"
    dist_info = metadata / f"accelerate-{VERSION}.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: accelerate\nVersion: {VERSION}\n", encoding="utf-8"
    )
    paths = [str(HERE), str(metadata), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    env["WORKBENCH_CONFORMANCE_REPORT"] = str(report)
    env.setdefault("HF_HUB_OFFLINE", "1")
    command = [sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(tree)]
    command += ["-p", "no:cacheprovider", "-p", "no:xdist", "-p", "reference_shim"]
    command += ["-q", "--tb=short", "-W", "ignore::DeprecationWarning", *REFERENCE_FILES]
    return subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)


def _expected_passing() -> list[str]:
    lines = (HERE / "reference_passing.txt").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line and not line.startswith("#")]


@pytest.mark.timeout(1200)
def test_reference_tests_that_pass_on_accelerate_pass_on_ours(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    pytest.importorskip("parameterized", reason="the reference's tests need parameterized (dev)")
    tree = _fetch_reference()
    report = tmp_path / "report.json"
    done = _run_reference_tests(tree, report, tmp_path / "pytest.ini")
    assert report.is_file(), f"the reference tests did not run:\n{done.stdout[-4000:]}"
    results = json.loads(report.read_text(encoding="utf-8"))
    outcomes: dict[str, str] = results["outcomes"]
    counts = Counter(outcomes.values())
    # shown by conftest.py's terminal summary (a property reaches the xdist controller too)
    summary = {"counts": dict(counts), "missing_names": results["missing_names"]}
    record_property("conformance", json.dumps(summary))
    expected = _expected_passing()
    assert len(expected) == 59  # what accelerate 1.15.0 itself passes on CPU here
    regressions = sorted(
        f"{name}: {outcomes.get(name, 'not run')}"
        for name in expected
        if outcomes.get(name) != "passed"
    )
    assert not regressions, (
        f"{len(regressions)} reference tests that pass on accelerate {VERSION} do not pass on "
        f"workbench.big_modeling ({dict(counts)}):\n"
        + "\n".join(regressions)
        + "\n\n"
        + done.stdout[-6000:]
    )
