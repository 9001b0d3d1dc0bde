"""Quantized weights mapped to a CUDA device: torchao's CUDA layouts, bitsandbytes' CUDA kernels.

The GPU tests skip without CUDA; the refusals for combinations that cannot work run anywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.big_modeling import load_checkpoint_and_dispatch
from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.quantization.apply import quantize_model
from workbench.big_modeling.quantization.backends import (
    check_device,
    check_offloaded,
    torchao_config,
)
from workbench.big_modeling.quantization.packed import stored_nbytes
from workbench.big_modeling.quantization.sizes import (
    cuda_int4_tile_packed_nbytes,
    quantized_weight_nbytes,
)
from workbench.models.demo import make_demo

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def cuda_precisions() -> list[str]:
    names = ["int8", "int4-g64", "int4-g128"]
    if torch.cuda.is_available() and torch.cuda.get_device_capability(0) >= (8, 9):
        names.append("fp8")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        return names
    return [*names, "nf4", "fp4-dq"]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", cuda_precisions())
def test_cuda_weight_is_quantized_on_its_device(precision: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 256), nn.Linear(256, 128)).to("cuda:0", torch.bfloat16)
    x = torch.randn(4, 512, device="cuda:0", dtype=torch.bfloat16)
    with torch.no_grad():
        reference = model(x).float()
    report = quantize_model(model, {"": precision})
    assert {m.tier for m in report.modules} == {"cuda:0"}
    for m, layer in zip(report.modules, model, strict=True):
        assert layer.weight.device.type == "cuda"
        assert type(layer.weight) is not nn.Parameter  # a quantized tensor subclass
        expected = quantized_weight_nbytes(precision, *layer.weight.shape, torch.bfloat16)
        if type(layer.weight).__name__ == "Int4TilePackedTo4dTensor":  # padded (no mslk)
            group = int(precision.removeprefix("int4-g"))
            expected = cuda_int4_tile_packed_nbytes(*layer.weight.shape, group, torch.bfloat16)
        assert m.weight_nbytes == stored_nbytes(layer.weight) == expected
    with torch.inference_mode():
        out = model(x).float()
    error = float((out - reference).norm() / reference.norm())
    assert 0 < error < (0.05 if precision in ("int8", "fp8") else 0.25)


@pytest.mark.gpu
@needs_cuda
def test_mixed_cuda_cpu_disk_map_generates(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from workbench.big_modeling import init_empty_weights

    folder = make_demo(tmp_path / "demo", params="2M", shards=2, dtype="bfloat16")
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(folder), dtype=torch.bfloat16
        ).eval()
    device_map = {
        "model.embed_tokens": 0,
        "model.layers.0": 0,
        "model.layers.1": 0,
        "model.layers.2": "cpu",
        "model.layers.3": "disk",
        "model.norm": 0,
        "model.rotary_emb": 0,
        "lm_head": 0,
    }
    precision_map = {"": "bfloat16", "model.layers.0": "int4-g64", "model.layers.1": "int8"}
    # cpu and disk layers run on cuda:0 once dispatched: int8 moves there, CPU int4 could not
    precision_map |= {"model.layers.2": "int8", "model.layers.3": "int8"}
    dispatched = load_checkpoint_and_dispatch(
        model,
        folder,
        device_map=device_map,
        offload_folder=tmp_path / "offload",
        precision_map=precision_map,
    )
    q_proj = dispatched.model.layers[0].self_attn.q_proj.weight
    assert q_proj.device.type == "cuda" and type(q_proj) is not nn.Parameter
    ids = torch.tensor([[1, 17, 42, 99, 5]], device="cuda:0")
    out = dispatched.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 9)

    with init_empty_weights():
        again = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(folder), dtype=torch.bfloat16
        ).eval()
    with pytest.raises(BadInputError, match=r"model\.layers\.3\.\S+: int4-g32 on the cpu/disk"):
        load_checkpoint_and_dispatch(
            again,
            folder,
            device_map=device_map,
            offload_folder=tmp_path / "offload2",
            precision_map={"model.layers.3": "int4-g32"},
        )


def test_an_accelerator_quantized_loads_cannot_use_is_refused_by_name() -> None:
    with pytest.raises(BadInputError, match=r"model\.layers\.0\.mlp\.up_proj: int4-g64 on mps"):
        check_device("model.layers.0.mlp.up_proj", "mps", "int4-g64", torch.bfloat16)
    check_device("model.layers.0.mlp.up_proj", "mps", "bfloat16", torch.bfloat16)  # a cast is fine
    check_device("model.layers.0.mlp.up_proj", "cpu", "nf4", torch.float32)
    with pytest.raises(
        BadInputError, match=r"h\.3\.fc: int4-g32 on the cpu/disk tier runs on cuda:0"
    ):
        check_offloaded("h.3.fc", torch.device("cuda:0"), "int4-g32", torch.bfloat16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is absent")
def test_cuda_without_cuda_is_refused_by_name() -> None:
    with pytest.raises(BadInputError, match=r"lm_head: int8 on cuda:0: CUDA is not available"):
        check_device("lm_head", "cuda:0", "int8", torch.bfloat16)


@pytest.mark.gpu
@needs_cuda
def test_cuda_refusals_name_module_device_and_precision() -> None:
    with pytest.raises(BadInputError, match=r"h\.0\.fc: int4-g128 on cuda:0: .*bfloat16"):
        check_device("h.0.fc", "cuda:0", "int4-g128", torch.float16)
    if torch.cuda.get_device_capability(0) < (8, 9):
        with pytest.raises(BadInputError, match=r"h\.0\.fc: fp8 on cuda:0: .*8\.9"):
            check_device("h.0.fc", "cuda:0", "fp8", torch.bfloat16)


def test_the_config_follows_the_device() -> None:
    assert type(torchao_config("int4-g64", "cpu")).__name__ == "PrototypeInt4WeightOnlyConfig"
    cuda_int4 = torchao_config("int4-g64", "cuda:0")
    assert type(cuda_int4).__name__ == "Int4WeightOnlyConfig" and cuda_int4.group_size == 64
    assert str(cuda_int4.int4_packing_format.value) in ("plain", "tile_packed_to_4d")
    assert type(torchao_config("fp8", "cuda:0")).__name__ == "Float8WeightOnlyConfig"
    with pytest.raises(BadInputError, match="nf4 is not a torchao format"):
        torchao_config("nf4", "cuda:0")
