"""Cancel a real load (no test hold) in the middle and while the model is built.

How soon a cancel returns (the 0.5 s target) is measured by ``benchmarks/bench_cancel.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from job_holds import HOLD_OBSERVER, hold_options

from workbench.big_modeling.errors import LoadCancelled
from workbench.big_modeling.progress import CancelToken
from workbench.runtime.jobs import open_model_cancellable
from workbench.runtime.protocol import Failed, Phase, Progress, Result
from workbench.runtime.worker import WorkerHost


@pytest.fixture(scope="module")
def big_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A llama demo large enough that a float32 load with every layer on disk takes a while
    (about 100 MB written to the offload folder)."""
    from workbench.models import make_demo

    return make_demo(
        tmp_path_factory.mktemp("cancel") / "demo", arch="llama", params="24M", shards=2
    )


ALL_LAYERS_ON_DISK = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers": "disk",
    "model.norm": "cpu",
    "lm_head": "cpu",
}


def _mid_load(request_id: int):
    def matches(event: Any) -> bool:
        return (
            isinstance(event, Progress)
            and event.request_id == request_id
            and event.phase == "loading"
            and 0 < event.bytes_done < event.bytes_total
        )

    return matches


@pytest.mark.slow
def test_cancelling_a_real_load_mid_way_is_cooperative_and_clean(
    host: WorkerHost, events: Any, big_demo: Path, tmp_path: Path
) -> None:
    load_id = host.load(big_demo, ALL_LAYERS_ON_DISK, dtype="float32")
    folder = host.offload_folder
    events.wait_for(_mid_load(load_id))
    assert host.cancel()
    final = events.final(load_id)
    assert isinstance(final, Failed) and final.kind == "cancelled", final
    assert "last phase: loading" in final.details
    assert not folder.exists() and list((tmp_path / "offload").iterdir()) == []
    assert host.state == "idle" and host.is_alive()  # cooperative: no terminate was needed

    again = host.load(big_demo, {"": "cpu"}, dtype="float32")
    assert isinstance(events.final(again), Result)


@pytest.mark.slow
def test_a_cancel_while_the_model_is_built_ends_the_load_without_a_terminate(
    events: Any, big_demo: Path, tmp_path: Path
) -> None:
    # a cold worker without preloaded imports spends seconds importing and building
    host = WorkerHost(events, offload_root=tmp_path / "offload", preload_imports=False)
    try:
        load_id = host.load(big_demo, ALL_LAYERS_ON_DISK, dtype="float32")
        events.wait_for(
            lambda e: isinstance(e, Phase) and e.request_id == load_id and e.phase == "building"
        )
        assert host.cancel()
        final = events.final(load_id)
        assert isinstance(final, Failed) and final.kind == "cancelled", final
        assert host.is_alive() and host.state == "idle"  # not terminated
        again = host.load(big_demo, {"": "cpu"}, dtype="float32")  # waits for the old build
        assert isinstance(events.final(again), Result)
    finally:
        host.shutdown()


def test_open_model_cancellable_checks_the_token_first(tmp_path: Path) -> None:
    from workbench.models import make_demo

    folder = make_demo(tmp_path / "demo", arch="llama", params="1M", shards=1)
    token = CancelToken()
    token.cancel()
    with pytest.raises(LoadCancelled):
        open_model_cancellable(str(folder), None, token)
    opened = open_model_cancellable(str(folder), None, CancelToken())
    assert opened.checkpoint is not None and type(opened.model).__name__ == "LlamaForCausalLM"


def _tensor_count(folder: Path) -> int:
    import json

    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return len(index["weight_map"])


@pytest.mark.slow
def test_a_cancelled_load_gives_every_byte_back(
    events: Any, big_demo: Path, tmp_path: Path
) -> None:
    """Issue 14 item 8: after a cancel the worker used to keep most of what the load had read
    (freed tensors stay in the allocator's arenas). The host now retires that process and starts
    a fresh warm one, so the worker's memory drops back to an idle worker's."""
    import psutil

    host = WorkerHost(
        events,
        offload_root=tmp_path / "offload",
        cancel_grace_s=30.0,
        load_observer=HOLD_OBSERVER,
    )
    try:
        host.start()
        assert host.wait_ready(120.0), "the worker never finished its imports"
        idle_rss = psutil.Process(host.pid).memory_info().rss
        # hold after three quarters of the tensors, cast to float32: ~70 MB read into the model
        options = hold_options(_tensor_count(big_demo) * 3 // 4)
        load_id = host.load(big_demo, {"": "cpu"}, dtype="float32", options=options)
        events.wait_for(
            lambda e: isinstance(e, Phase) and e.request_id == load_id and e.phase == "held"
        )
        loading = psutil.Process(host.pid)
        held_rss = loading.memory_info().rss
        assert held_rss - idle_rss > 40 * 2**20, (held_rss, idle_rss)
        assert host.cancel()
        final = events.final(load_id)
        assert isinstance(final, Failed) and final.kind == "cancelled", final
        assert host.state == "idle" and host.is_alive()
        assert host.pid != loading.pid and host.retired_pids == [loading.pid]
        host.wait_retired()
        assert not psutil.pid_exists(loading.pid)  # exited and reaped: its memory is back
        assert host.wait_ready(120.0)
        after_rss = psutil.Process(host.pid).memory_info().rss
        grown = held_rss - idle_rss
        print(
            f"worker rss: idle {idle_rss / 2**20:.0f} MiB, held {held_rss / 2**20:.0f} MiB, "
            f"after cancel {after_rss / 2**20:.0f} MiB"
        )
        # a fresh idle worker: within a tenth of what the load had taken (import noise)
        assert after_rss - idle_rss < grown / 10, (idle_rss, held_rss, after_rss)
        again = host.load(big_demo, {"": "cpu"}, dtype="float32")  # the fresh worker loads
        assert isinstance(events.final(again), Result)
    finally:
        host.shutdown()
    assert host.state == "stopped"
