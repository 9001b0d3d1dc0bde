"""Real nf4 / fp4 loads on the CPU with bitsandbytes 0.50 (``quantization.bnb4``).

The checkpoint is the demo Llama of ``test_quantized_loads`` (bf16, hidden 192, intermediate
512, 4 layers, two shards). Layers 0-1 are on cpu (quantized in place), layers 2-3 on disk
(packed once into the offload folder, rebuilt by the hook per forward). Bytes are counted from
the storages of the real inner tensors and from the packed files on disk, against
``quantization/sizes.py``'s prediction.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from workbench.big_modeling import load_checkpoint_and_dispatch
from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.loading.api import load_checkpoint_in_model
from workbench.big_modeling.quantization.apply import quantize_model
from workbench.big_modeling.quantization.bnb4 import Bnb4bitTensor, quantize_4bit
from workbench.big_modeling.quantization.sizes import quantized_weight_nbytes
from workbench.models.demo import make_demo

pytest.importorskip("bitsandbytes", reason="nf4/fp4 loads need bitsandbytes (dev extra)")

from tests.big_modeling.test_quantized_loads import (
    DEVICE_MAP,
    LINEARS,
    empty_model,
    load_on_both_tiers,
    module,
    safetensors_data_nbytes,
)

PRECISION_MAP = {
    "": "bfloat16",
    "model.layers.0": "nf4",
    "model.layers.1": "fp4-dq",
    "model.layers.2": "nf4-dq",
    "model.layers.3": "fp4",
}


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo(
        tmp_path_factory.mktemp("nf4") / "demo", params="2M", shards=2, dtype="bfloat16"
    )


def storage_nbytes(tensor: torch.Tensor) -> int:
    """Bytes of the storages behind a 4-bit weight's inner tensors (not the shapes' claim)."""
    names, _ = tensor.__tensor_flatten__()
    return sum(getattr(tensor, name).untyped_storage().nbytes() for name in names)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


@pytest.mark.parametrize("name", ["nf4", "nf4-dq", "fp4", "fp4-dq"])
@pytest.mark.parametrize("shape", [(96, 192), (33, 70), (512, 64)])
def test_4bit_weight_storage_and_forward(shape: tuple[int, int], name: str) -> None:
    torch.manual_seed(0)
    weight = torch.randn(shape, dtype=torch.bfloat16) * 0.02
    packed = quantize_4bit(weight, name)
    assert packed.shape == weight.shape and packed.dtype == torch.bfloat16
    assert storage_nbytes(packed) == quantized_weight_nbytes(name, *shape, torch.bfloat16)
    x = torch.randn(3, 5, shape[1], dtype=torch.bfloat16)
    out = torch.nn.functional.linear(x, packed)
    # the kernel computes with exactly the dequantized weight
    expected = torch.nn.functional.linear(x, packed.dequantize())
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-3)
    assert relative_error(out, torch.nn.functional.linear(x, weight)) < 0.2


def test_nf4_fp4_map_loads_dispatches_and_generates(demo_folder: Path, tmp_path: Path) -> None:
    model = load_checkpoint_and_dispatch(
        empty_model(demo_folder),
        demo_folder,
        device_map=DEVICE_MAP,
        offload_folder=tmp_path / "offload",
        precision_map=PRECISION_MAP,
    )
    first = module(model, 0, "q_proj").weight
    assert isinstance(first, Bnb4bitTensor) and first.quant_type == "nf4" and not first.nested
    second = module(model, 1, "down_proj").weight
    assert second.quant_type == "fp4" and second.nested
    assert module(model, 2, "up_proj").weight.device.type == "meta"

    seen: dict[str, tuple[str, bool]] = {}

    def record(mod: torch.nn.Module, label: str) -> None:
        inner = mod._old_forward

        def forward(x: torch.Tensor) -> torch.Tensor:
            seen[label] = (mod.weight.quant_type, mod.weight.nested)
            return inner(x)

        mod._old_forward = forward

    record(module(model, 2, "up_proj"), "disk nf4-dq")
    record(module(model, 3, "o_proj"), "disk fp4")
    ids = torch.tensor([[1, 17, 42, 99, 5, 230]])
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape == (1, 11)
    assert seen == {"disk nf4-dq": ("nf4", True), "disk fp4": ("fp4", False)}


def test_nf4_logits_are_as_close_to_bf16_as_int4_g64(demo_folder: Path, tmp_path: Path) -> None:
    """Measured on this demo: int4-g64 0.200, nf4 0.211, fp4 0.301 (relative L2 of logits)."""
    ids = torch.tensor([[1, 17, 42, 99, 5, 230]])

    def logits(precision: str | None) -> torch.Tensor:
        model = load_checkpoint_and_dispatch(
            empty_model(demo_folder),
            demo_folder,
            device_map=DEVICE_MAP,
            offload_folder=tmp_path / str(precision),
            precision_map=None if precision is None else {"model.layers": precision},
        )
        with torch.inference_mode():
            return model(ids).logits

    reference = logits(None)
    int4 = relative_error(logits("int4-g64"), reference)
    nf4 = relative_error(logits("nf4"), reference)
    fp4 = relative_error(logits("fp4-dq"), reference)
    assert 0 < nf4 < 1.25 * int4
    assert nf4 < fp4 < 2 * int4


def test_4bit_bytes_per_tier_match_storages_files_and_plan(
    demo_folder: Path, tmp_path: Path
) -> None:
    offload = tmp_path / "offload"
    model, report = load_on_both_tiers(demo_folder, offload, PRECISION_MAP)
    # by hand, nf4 192 x 192: 18,432 packed + 576 blocks * 4 B absmax + 16 * 4 B code = 20,800
    by_name = {m.name: m for m in report.modules}
    assert by_name["model.layers.0.self_attn.q_proj"].weight_nbytes == 20_800
    cpu_storages = sum(
        storage_nbytes(module(model, layer, name).weight) for layer in (0, 1) for name in LINEARS
    )
    cpu_reported = sum(
        m.weight_nbytes for m in report.modules if m.tier == "cpu" and ".layers." in m.name
    )
    assert cpu_storages == cpu_reported
    assert len(report.packed_files) == 2 * len(LINEARS)
    disk_bytes = sum(safetensors_data_nbytes(path) for path in report.packed_files)
    assert disk_bytes == report.nbytes_by_tier()["disk"]
    linears = dict(model.named_modules())
    for m in report.modules:
        rows, columns = linears[m.name].out_features, linears[m.name].in_features
        assert m.weight_nbytes == quantized_weight_nbytes(
            m.precision, rows, columns, torch.bfloat16
        )


def test_without_bitsandbytes_nf4_is_refused_with_the_install_hint(
    demo_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offload = tmp_path / "offload"
    model = load_checkpoint_and_dispatch(
        empty_model(demo_folder),
        demo_folder,
        device_map=DEVICE_MAP,
        offload_folder=offload,
        precision_map={"": "bfloat16", "model.layers.2": "nf4"},
    )
    fresh = empty_model(demo_folder)
    load_checkpoint_in_model(fresh, demo_folder, device_map={"": "cpu"})
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import bitsandbytes` now fails
    with pytest.raises(BadInputError, match=r"install bitsandbytes"):
        quantize_model(fresh, {"model.layers.0": "nf4"})
    assert type(module(fresh, 0, "q_proj").weight) is torch.nn.Parameter  # left as loaded
    with (
        pytest.raises(BadInputError, match=r"nf4/fp4 weights need bitsandbytes"),
        torch.inference_mode(),
    ):
        model(torch.tensor([[3, 4, 5]]))  # the disk layer's packed nf4 weight cannot run
