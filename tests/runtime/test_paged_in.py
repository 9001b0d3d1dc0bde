"""A run reports the memory-mapped weights it paged in on first use (``paged_in_bytes``): the
first run after a zero-copy load reads them as it touches them, which is in its time to first
token and not in the speed model's prediction; the next run, and a load that copied, page in
none."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.big_modeling.progress import CancelToken
from workbench.runtime.formatting import PAGED_IN_NOTE_BYTES, paged_in_words
from workbench.runtime.jobs import JobRunner
from workbench.runtime.protocol import Infer, InferenceResult, Load, Result


@pytest.fixture
def runner() -> Iterator[JobRunner]:
    job_runner = JobRunner(lambda event: None)
    yield job_runner
    job_runner.close()


def _run(runner: JobRunner, request_id: int) -> InferenceResult:
    final = runner.run(
        Infer(request_id, prompt="The capital of France is", max_new_tokens=3), CancelToken()
    )
    assert isinstance(final, Result), final
    return final.value


def test_the_first_run_after_a_zero_copy_load_pages_its_weights_in(
    runner: JobRunner, demo_dir: Path, tmp_path: Path
) -> None:
    load = Load(1, source=str(demo_dir), device_map={"": "cpu"}, offload_folder=str(tmp_path))
    assert isinstance(runner.run(load, CancelToken()), Result)  # as stored: memory-mapped
    layers = runner.loaded.opened.tree.node("model.layers").nbytes
    first = _run(runner, 2)
    # every decoder layer's matmuls read all of their weights: those pages join the process
    assert first.paged_in_bytes >= layers >= PAGED_IN_NOTE_BYTES
    assert paged_in_words(first.paged_in_bytes).startswith("this run paged in ")
    second = _run(runner, 3)
    assert (
        second.paged_in_bytes < PAGED_IN_NOTE_BYTES and paged_in_words(second.paged_in_bytes) == ""
    )


def test_a_load_that_copies_its_weights_pages_nothing_in(
    runner: JobRunner, demo_dir: Path, tmp_path: Path
) -> None:
    load = Load(
        1,
        source=str(demo_dir),
        device_map={"": "cpu"},
        offload_folder=str(tmp_path),
        dtype="float32",
    )
    assert isinstance(runner.run(load, CancelToken()), Result)  # cast: anonymous copies
    assert _run(runner, 2).paged_in_bytes < PAGED_IN_NOTE_BYTES
