"""The session stores the memory model's options, so a reopened session gives each device the
reserve it had; files saved before the options were stored still open."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.big_modeling.errors import BadInputError
from workbench.models.demo import make_demo
from workbench.runtime.planning import MemoryOptions, device_reserves
from workbench.runtime.session import Session, SessionChange, SessionFileError


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo(tmp_path_factory.mktemp("memory") / "demo", arch="llama", params="2M")


def test_a_reopened_session_reproduces_the_per_device_reserves(demo: Path, tmp_path: Path) -> None:
    options = MemoryOptions(batch=3, context=256, kv_dtype="fp8", context_cap=128,
                            prefill_tokens=64)  # fmt: skip
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu",
                  "model.layers.2": "disk", "model.layers.3": "disk", "model.norm": "cpu",
                  "model.rotary_emb": "cpu", "lm_head": "cpu"}  # fmt: skip
    session = Session(source=str(demo), device_map=device_map, memory=options)
    opened = session.reopen()
    before = session.device_reserves()
    assert before == device_reserves(opened, device_map, options)
    # 4 layers (the disk ones run on the cpu) x 3 sequences x 256 tokens x 3 KV heads x
    # (64 + 64) x 1 B (fp8) = 1.125 MiB of cache on the cpu
    assert before["cpu"].kv_nbytes == 4 * 3 * 256 * 3 * 128 * 1
    assert before["cpu"].why.endswith("for 64-token prefill chunks")
    path = session.save(tmp_path / "s.wbsession.json")
    saved = json.loads(path.read_text())["memory"]
    assert saved == {"batch": 3, "context": 256, "kv_dtype": "fp8", "engine": "transformers",
                     "context_cap": 128, "prefill_tokens": 64}  # fmt: skip
    restored = Session.restore(path)
    assert restored.memory == options and restored.device_reserves() is None  # not opened yet
    restored.reopen()
    assert restored.device_reserves() == before
    assert not restored.dirty


def test_an_old_file_without_memory_options_still_opens(tmp_path: Path) -> None:
    path = tmp_path / "old.wbsession.json"
    path.write_text(json.dumps({"format": "workbench-session", "version": 1, "source": "demo",
                                "device_map": {"": "cpu"}, "reserve": 2048}))  # fmt: skip
    session = Session.restore(path)
    assert session.memory is None and session.reserve == 2048
    assert session.to_dict()["memory"] is None


def test_set_memory_notifies_once_and_refuses_other_types() -> None:
    session = Session()
    changes: list[SessionChange] = []
    session.subscribe(changes.append)
    assert session.set_memory(MemoryOptions(prefill_tokens=512), reason="reserve options") is None
    assert session.set_memory(MemoryOptions(prefill_tokens=512)) == MemoryOptions(
        prefill_tokens=512
    )
    assert [c.what for c in changes] == ["memory", "dirty"]  # the same options: no change
    assert changes[0].reason == "reserve options"
    with pytest.raises(BadInputError, match="must be MemoryOptions, got dict"):
        session.set_memory({"batch": 1})  # type: ignore[arg-type]
    assert session.memory == MemoryOptions(prefill_tokens=512)


@pytest.mark.parametrize(
    ("memory", "problem"),
    [
        ([1, 2], 'field "memory" must be an object or null, got list'),
        ({"prefill_tokens": 0}, 'field "memory": memory options must be positive'),
        ({"prefill": 512}, 'field "memory": unknown memory options: prefill'),
        ({"engine": "tgi"}, "unknown KV cache engine 'tgi'"),
    ],
)
def test_bad_memory_options_name_the_file(tmp_path: Path, memory: object, problem: str) -> None:
    path = tmp_path / "bad.wbsession.json"
    path.write_text(json.dumps({"format": "workbench-session", "version": 1, "memory": memory}))
    with pytest.raises(SessionFileError, match=r"bad\.wbsession\.json") as caught:
        Session.restore(path)
    assert problem in str(caught.value)


def test_the_sessions_precision_map_gives_its_4_bit_weights_room_to_dequantize(demo: Path) -> None:
    session = Session(source=str(demo), device_map={"": "cpu"}, memory=MemoryOptions(context=64))
    session.reopen()
    plain = session.device_reserves()["cpu"]
    session.set_precision_map({"model.layers": "nf4"})
    nf4 = session.device_reserves()["cpu"]
    # the demo's MLP weights, 512 x 192 in its float16, are its largest 4-bit ones
    assert nf4.dequantize_nbytes == 512 * 192 * 2
    assert nf4.nbytes == plain.nbytes + 512 * 192 * 2
