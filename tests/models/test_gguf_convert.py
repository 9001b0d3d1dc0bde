"""Convert for loading: a GGUF becomes a sharded safetensors Hugging Face folder in the cache,
once, with progress and cancel, leaving nothing behind when it fails or is cancelled."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tiny_gguf import write_tiny_gguf

from workbench.big_modeling.errors import LoadCancelled
from workbench.big_modeling.progress import CancelToken
from workbench.models.errors import ModelSourceError
from workbench.models.gguf_convert import CONVERT_STAGES, ConvertProgress, convert_gguf
from workbench.models.intake import open_model
from workbench.runtime.gguf_convert import ConversionDone, iter_conversion


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.Q8_0.gguf"
    write_tiny_gguf(path)
    return path


@pytest.fixture(scope="module")
def converted(tiny_gguf, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert_gguf(tiny_gguf, cache_root=tmp_path_factory.mktemp("converted"))


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as handle:
            tensors |= {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    return tensors


def _left_in(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def test_conversion_writes_a_hugging_face_folder(converted, tiny_gguf) -> None:
    names = {p.name for p in converted.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= names
    assert "model.safetensors" in names  # 181 kB: one shard
    assert not any(name.endswith(".tmp") for name in names)
    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "bfloat16"
    assert config["tie_word_embeddings"] is True
    assert (config["num_hidden_layers"], config["hidden_size"]) == (2, 64)
    source = json.loads((converted / "workbench_gguf.json").read_text())
    assert source["file"] == tiny_gguf.name
    assert converted.name == f"tiny-llama.Q8_0-{source['sha256'][:16]}"  # keyed by the hash
    tensors = _tensors(converted)
    assert "lm_head.weight" not in tensors  # tied to the embeddings
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}


def test_converted_weights_are_what_transformers_gguf_loader_gives(converted, tiny_gguf) -> None:
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    opened = open_model(str(tiny_gguf))
    reference = load_gguf_checkpoint(
        str(tiny_gguf), return_tensors=True, model_to_load=opened.model
    )["tensors"]
    ours = _tensors(converted)
    assert sorted(ours) == sorted(reference)
    for name, tensor in reference.items():
        # bitwise: the same de-quantization and q/k un-permutation, then one cast to bfloat16
        torch.testing.assert_close(ours[name], tensor.to(torch.bfloat16), rtol=0, atol=0)


def test_the_converted_folder_plans_as_the_header_did(converted, tiny_gguf) -> None:
    from_header = open_model(str(tiny_gguf))
    from_folder = open_model(converted, dtype="bfloat16")
    assert from_folder.has_weights
    assert from_folder.missing_keys == [] and from_folder.unexpected_keys == []
    assert from_folder.module_sizes() == from_header.module_sizes()


def test_a_cached_conversion_is_found_by_hash(tiny_gguf, converted, tmp_path) -> None:
    copy = tmp_path / "renamed.gguf"
    copy.write_bytes(tiny_gguf.read_bytes())
    stages: list[str] = []
    again = convert_gguf(
        tiny_gguf, cache_root=converted.parent, progress=lambda r: stages.append(r.stage)
    )
    assert again == converted
    assert stages == ["hashing file"]  # nothing converted the second time
    other_name = convert_gguf(copy, cache_root=converted.parent)
    assert other_name.name.endswith(converted.name.rsplit("-", 1)[1])  # same hash


def test_progress_reports_every_tensor_in_stage_order(tiny_gguf, tmp_path) -> None:
    reports: list[ConvertProgress] = []
    convert_gguf(tiny_gguf, cache_root=tmp_path / "cache", progress=reports.append)
    stages = list(dict.fromkeys(r.stage for r in reports))
    assert stages == list(CONVERT_STAGES)
    tensor_reports = [r for r in reports if r.stage == "converting tensors"]
    assert [r.done for r in tensor_reports] == list(range(21))  # 20 tensors in the tiny file
    assert tensor_reports[-1].describe() == "converting tensors (20 of 20)"


@pytest.mark.parametrize("stage", ["hashing file", "converting tensors", "writing tokenizer"])
def test_a_cancelled_conversion_leaves_nothing(tiny_gguf, tmp_path, stage) -> None:
    cache = tmp_path / "cache"
    token = CancelToken()

    def cancel_at(report: ConvertProgress) -> None:
        if report.stage == stage and report.done >= report.total // 2:
            token.cancel()

    with pytest.raises(LoadCancelled):
        convert_gguf(tiny_gguf, cache_root=cache, progress=cancel_at, cancel=token)
    assert _left_in(cache) == []


def test_a_failed_conversion_names_the_problem_and_leaves_nothing(tmp_path) -> None:
    short = tmp_path / "short.gguf"
    write_tiny_gguf(short, block_count=3)  # the header claims 3 blocks; the file holds 2
    cache = tmp_path / "cache"
    with pytest.raises(
        ModelSourceError, match=r"gives no weights for 9 tensors.*model\.layers\.2\."
    ):
        convert_gguf(short, cache_root=cache)
    assert _left_in(cache) == []


def test_an_unsupported_architecture_is_refused_before_any_work(tmp_path) -> None:
    odd = tmp_path / "odd.gguf"
    write_tiny_gguf(odd, arch="rwkv6")
    cache = tmp_path / "cache"
    with pytest.raises(ModelSourceError, match=r"'rwkv6' cannot be converted.*llama"):
        convert_gguf(odd, cache_root=cache)
    assert not cache.exists()


def test_the_runtime_job_yields_progress_then_the_folder(tiny_gguf, tmp_path) -> None:
    events = list(iter_conversion(tiny_gguf, CancelToken(), cache_root=tmp_path / "cache"))
    assert isinstance(events[-1], ConversionDone)
    assert (events[-1].folder / "config.json").is_file()
    progress = [e for e in events[:-1] if isinstance(e, ConvertProgress)]
    assert len(progress) == len(events) - 1
    assert list(dict.fromkeys(e.stage for e in progress)) == list(CONVERT_STAGES)
    last_tensor_report = [e for e in progress if e.stage == "converting tensors"][-1]
    assert last_tensor_report.done == last_tensor_report.total == 20


def test_closing_the_runtime_job_cancels_the_conversion(tiny_gguf, tmp_path) -> None:
    cache = tmp_path / "cache"
    token = CancelToken()
    job = iter_conversion(tiny_gguf, token, cache_root=cache, interval_s=0.0)
    for event in job:
        if isinstance(event, ConvertProgress) and event.stage == "converting tensors":
            break
    job.close()  # joins the worker thread
    assert token.cancelled
    assert not any(t.name == "convert gguf" for t in threading.enumerate())
    assert _left_in(cache) == []


def test_a_cancelled_runtime_job_raises(tiny_gguf, tmp_path) -> None:
    token = CancelToken()
    token.cancel()
    with pytest.raises(LoadCancelled):
        list(iter_conversion(tiny_gguf, token, cache_root=tmp_path / "cache"))


def test_the_load_job_converts_a_gguf_for_loading(tiny_gguf, tmp_path, monkeypatch) -> None:
    from workbench.runtime.jobs import JobRunner
    from workbench.runtime.protocol import Load, Result

    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path / "cache"))
    runner = JobRunner(lambda event: None)
    try:
        device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu"}
        device_map |= {"model.layers": "disk", "model.norm": "cpu", "lm_head": "cpu"}
        final = runner.run(
            Load(
                1,
                source=str(tiny_gguf),
                device_map=device_map,
                offload_folder=str(tmp_path / "offload"),
            ),
            CancelToken(),
        )
        assert isinstance(final, Result), final
    finally:
        runner.close()
    (folder,) = (tmp_path / "cache" / "gguf").iterdir()
    assert (folder / "model.safetensors").is_file()
