"""Print the conformance counts (passed / failed / missing / skipped) after the run."""

from __future__ import annotations

import json

import pytest

_summaries: list[dict] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for name, value in report.user_properties:
        if name == "conformance":
            _summaries.append(json.loads(value))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for summary in _summaries:
        counts = summary["counts"]
        kinds = ("passed", "failed", "missing", "skipped")
        shown = ", ".join(f"{counts.get(kind, 0)} {kind}" for kind in kinds)
        terminalreporter.write_sep("-", "accelerate 1.15.0 conformance")
        terminalreporter.write_line(f"reference tests on workbench.big_modeling: {shown}")
        if summary["missing_names"]:
            terminalreporter.write_line("missing names: " + ", ".join(summary["missing_names"]))
