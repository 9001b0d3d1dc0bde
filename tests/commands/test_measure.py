"""``workbench measure``: this machine's host probes taken again, as text (real probes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest


@pytest.mark.slow
def test_measure_prints_each_probe_and_caches_them(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    code, out, err = cli("measure")
    assert "measuring this machine" in err
    lines = out.splitlines()
    # the dispatch probe refuses a measurement drowned by other load: exit 1 and it says so
    drowned = lines[0].startswith("dispatch: not measured (see the log)")
    assert code == (1 if drowned else 0), err
    assert drowned or re.fullmatch(
        r"dispatch: [\d.]+ us per module call, [\d.]+ ms per forward"
        r"(, elementwise work [\d.]+ us a token in a 576-wide layer)? \(\d+ threads\)"
        r"( \(other processes took \d+% of the CPU meanwhile: .*\))?",  # the suite's own load
        lines[0],
    )
    assert lines[1].startswith("cpu matmul curve: a 1 MiB weight takes ") and "bfloat16" in lines[1]
    assert lines[2].startswith("cpu kernels: bf16 reads ")
    written = {"cpu-matmul-curve.json", "cpu-kernels.json"}
    assert {p.name for p in tmp_path.iterdir()} >= written | (
        set() if drowned else {"dispatch-overhead.json"}
    )
