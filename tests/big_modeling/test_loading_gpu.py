"""CUDA loads: chunked pinned double-buffered uploads, casts on the GPU, mixed maps."""

from __future__ import annotations

from pathlib import Path

import checkpoint_fixtures as fx
import pytest
import torch
from checkpoint_fixtures import TinyNet, empty_model, make_reference
from safetensors.torch import save_file

from workbench.big_modeling import load_checkpoint_and_dispatch, load_checkpoint_in_model
from workbench.big_modeling.errors import LoadCancelled
from workbench.big_modeling.loading import reader
from workbench.big_modeling.progress import CancelToken, LoadProgress

# session fixtures shared with the other loading tests
reference_model = fx.reference_model
sharded_ckpt = fx.sharded_ckpt

pytestmark = pytest.mark.gpu
IDS = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 15]])


@pytest.mark.parametrize("chunk_nbytes", [64 * 2**20, 96])  # 96 B: every weight takes many chunks
def test_load_to_gpu_bitwise(
    chunk_nbytes: int, sharded_ckpt: Path, reference_model: TinyNet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "READ_CHUNK_NBYTES", chunk_nbytes)
    model = empty_model()
    load_checkpoint_in_model(model, sharded_ckpt, device_map={"": 0})
    for name, tensor in reference_model.state_dict().items():
        got = model.state_dict()[name]
        assert got.device == torch.device("cuda", 0), name
        assert torch.equal(got.cpu(), tensor), name
    assert model.head.weight is model.embed.weight


def test_cast_on_gpu_and_ints_kept(sharded_ckpt: Path, reference_model: TinyNet) -> None:
    model = empty_model()
    load_checkpoint_in_model(
        model,
        sharded_ckpt,
        device_map={"": "cuda:0"},
        dtype=torch.bfloat16,
        keep_in_fp32_modules=["norm"],
    )
    assert model.embed.weight.dtype == torch.bfloat16 and model.embed.weight.is_cuda
    assert model.norm.weight.dtype == torch.float32
    assert model.position_ids.dtype == torch.int64 and model.position_ids.is_cuda
    assert torch.equal(model.embed.weight.cpu(), reference_model.embed.weight.to(torch.bfloat16))


def test_mixed_gpu_cpu_disk_dispatch_runs(
    sharded_ckpt: Path, reference_model: TinyNet, tmp_path: Path
) -> None:
    device_map = {
        "embed": 0,
        "head": 0,
        "blocks.0": 0,
        "blocks.1": "cpu",
        "blocks.2": "disk",
        "norm": 0,
        "position_ids": 0,
        "scratch": 0,
    }
    model = load_checkpoint_and_dispatch(
        empty_model(), sharded_ckpt, device_map=device_map, offload_folder=tmp_path / "off"
    )
    assert model.blocks[0].up.weight.is_cuda
    out = model.eval()(IDS.cuda())
    torch.testing.assert_close(out.cpu(), reference_model(IDS), rtol=1e-5, atol=1e-5)


def test_in_place_load_into_cuda_model(sharded_ckpt: Path, reference_model: TinyNet) -> None:
    model = make_reference(seed=7).cuda()
    weight = model.blocks[1].up.weight
    load_checkpoint_in_model(model, sharded_ckpt)
    assert model.blocks[1].up.weight is weight
    assert torch.equal(weight.cpu(), reference_model.blocks[1].up.weight)


def test_large_tensor_upload_peak_gpu_memory(tmp_path: Path) -> None:
    """256 MiB of weights: GPU memory grows by the weights only (staging is in pinned host memory)."""
    weight = torch.randn(8192, 8192)  # 8192*8192*4 B = 256 MiB
    save_file({"weight": weight}, tmp_path / "model.safetensors")
    layer = torch.nn.Linear(8192, 8192, bias=False, device="meta")
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    load_checkpoint_in_model(layer, tmp_path, device_map={"": 0})
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before <= 256 * 2**20 + 2**20
    assert torch.equal(layer.weight.cpu(), weight)


def test_cancel_mid_upload_then_reload_is_exact(
    sharded_ckpt: Path, reference_model: TinyNet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel while chunks are in flight on the side stream: the load stops cleanly (the
    stream is drained before the pinned buffers go), and a second load gives exact weights."""
    monkeypatch.setattr(reader, "READ_CHUNK_NBYTES", 96)  # many chunks per weight
    token = CancelToken()
    reports: list[LoadProgress] = []

    def cancel_after_some_chunks(report: LoadProgress) -> None:
        reports.append(report)
        if len(reports) == 5:
            token.cancel()

    with pytest.raises(LoadCancelled):
        load_checkpoint_in_model(
            empty_model(),
            sharded_ckpt,
            device_map={"": 0},
            progress=cancel_after_some_chunks,
            cancel=token,
        )
    assert reports[-1].bytes_done < reports[-1].bytes_total  # stopped part-way
    torch.cuda.synchronize()
    model = empty_model()
    load_checkpoint_in_model(model, sharded_ckpt, device_map={"": 0})
    for name, tensor in reference_model.state_dict().items():
        assert torch.equal(model.state_dict()[name].cpu(), tensor), name
