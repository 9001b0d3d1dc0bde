"""A zero-copy load pages its memory-mapped CPU weights in (``page_in``), so its first run
reads none of them in its time to first token; a run still reports what it paged in
(``paged_in_bytes``: pages the kernel reclaimed, or a load that left them out).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.big_modeling.errors import LoadCancelled
from workbench.big_modeling.progress import CancelToken
from workbench.runtime.formatting import PAGED_IN_NOTE_BYTES, paged_in_words
from workbench.runtime.jobs import JobRunner
from workbench.runtime.memory_readings import read_mapped_bytes
from workbench.runtime.page_in import cpu_tensors, page_in_cpu_weights
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


def _mapped_resident(folder: Path) -> int:
    """Bytes of ``folder``'s safetensors files resident in this process's mappings."""
    total, counting = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
            counting = len(head) >= 6 and head[-1].startswith(str(folder))
            counting = counting and head[-1].endswith(".safetensors")
        elif counting and line.startswith("Rss:"):
            total += int(head[1]) * 1024
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux smaps")
def test_a_zero_copy_load_pages_its_weights_in_before_the_first_run(
    runner: JobRunner, demo_dir: Path, tmp_path: Path
) -> None:
    load = Load(1, source=str(demo_dir), device_map={"": "cpu"}, offload_folder=str(tmp_path))
    assert isinstance(runner.run(load, CancelToken()), Result)  # as stored: memory-mapped
    layers = runner.loaded.opened.tree.node("model.layers").nbytes
    assert layers >= PAGED_IN_NOTE_BYTES
    # the load brought every decoder layer's mapped pages into the worker...
    loaded = _mapped_resident(demo_dir.resolve())
    assert loaded >= layers
    # ...so the first run reads none of them
    first = _run(runner, 2)
    assert _mapped_resident(demo_dir.resolve()) == loaded
    assert first.paged_in_bytes == 0 and paged_in_words(first.paged_in_bytes) == ""
    second = _run(runner, 3)
    assert (
        second.paged_in_bytes < PAGED_IN_NOTE_BYTES and paged_in_words(second.paged_in_bytes) == ""
    )


def test_paging_in_reports_its_bytes_and_stops_on_cancel(demo_dir: Path) -> None:
    from workbench.big_modeling import load_checkpoint_and_dispatch
    from workbench.models.intake import open_model

    opened = open_model(str(demo_dir))
    model = load_checkpoint_and_dispatch(opened.model, str(demo_dir), device_map={"": "cpu"})
    reports: list[tuple[int, int]] = []
    total = page_in_cpu_weights(model, progress=lambda done, of: reports.append((done, of)))
    assert total == sum(t.numel() * t.element_size() for t in cpu_tensors(model)) > 0
    assert reports[-1] == (total, total) and all(of == total for _, of in reports)
    assert [done for done, _ in reports] == sorted(done for done, _ in reports)
    token = CancelToken()
    token.cancel()
    with pytest.raises(LoadCancelled):
        page_in_cpu_weights(model, cancel=token)


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


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux smaps")
def test_mapped_bytes_count_the_pages_touched_under_the_folders_only(tmp_path: Path) -> None:
    import mmap

    inside, outside = tmp_path / "model", tmp_path / "other"
    inside.mkdir()
    outside.mkdir()
    pages = 256
    for folder in (inside, outside):
        (folder / "weights.bin").write_bytes(b"\1" * (pages * mmap.PAGESIZE))
    with (
        open(inside / "weights.bin", "rb") as mine,
        open(outside / "weights.bin", "rb") as theirs,
        mmap.mmap(mine.fileno(), 0, access=mmap.ACCESS_READ) as mapped,
        mmap.mmap(theirs.fileno(), 0, access=mmap.ACCESS_READ) as elsewhere,
    ):
        assert read_mapped_bytes([inside]) == 0
        assert mapped[0] == 1  # one page, and those the kernel maps around it (its folio...)
        first = read_mapped_bytes([inside])
        assert first is not None and mmap.PAGESIZE <= first <= pages * mmap.PAGESIZE
        assert sum(mapped[i * mmap.PAGESIZE] for i in range(pages)) == pages
        assert sum(elsewhere[i * mmap.PAGESIZE] for i in range(pages)) == pages
        assert read_mapped_bytes([inside]) == pages * mmap.PAGESIZE  # not the other folder's
        assert read_mapped_bytes([inside, outside]) == 2 * pages * mmap.PAGESIZE
