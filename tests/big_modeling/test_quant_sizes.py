"""Quantized sizes against the libraries: real ``nn.Linear`` weights quantized on CPU, bytes
counted from the storages of every inner tensor, compared with ``quantized_weight_nbytes``.

Formats and their CPU paths (torchao 0.18, bitsandbytes 0.50):
- int8: torchao ``Int8WeightOnlyConfig`` (``Int8Tensor``).
- int4-gG: torchao's CPU path is ``PrototypeInt4WeightOnlyConfig`` (``Int4OpaqueTensor``, the
  tinygemm CPU packing); ``Int4WeightOnlyConfig``'s packing formats have no CPU path in 0.18
  (plain/preshuffled need the ``mslk`` package, plain_int32 "does not support device cpu",
  tile_packed_to_4d needs CUDA). Its scale+zero layout is the same bytes.
- fp8: torchao ``Float8WeightOnlyConfig`` (``Float8Tensor``, per-row scale).
- nf4 / fp4 (+ double quant): bitsandbytes ``quantize_4bit`` on CPU, the layout transformers'
  ``BitsAndBytesConfig`` loads; torchao has no FP4 weight-only path and its ``NF4Tensor`` is a
  different (always double-quantized) layout.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from workbench.big_modeling.quantization.keep_high_precision import default_keep_high_precision
from workbench.big_modeling.quantization.sizes import (
    QuantizableWeights,
    bits_per_weight,
    linear_weight_shapes,
    module_sizes_of,
    precision_of,
    quantized_weight_nbytes,
    tensor_nbytes_under,
)

torchao = pytest.importorskip("torchao", reason="torchao is a dependency: pip install torchao")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torchao.prototype.quantization.int4.inference_workflow import (
        PrototypeInt4WeightOnlyConfig,
    )
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

# (out, in): multiples of every group, rows not a multiple of 64, columns not a multiple of 128
SHAPES = [(256, 512), (96, 192), (48, 320), (16, 64)]


def stored_nbytes(tensor: torch.Tensor) -> int:
    """Bytes of every plain tensor inside ``tensor``, walking torchao subclasses."""
    if type(tensor) is not torch.Tensor and hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        return sum(stored_nbytes(getattr(tensor, name)) for name in names)
    return tensor.untyped_storage().nbytes()


def quantized_linear(shape: tuple[int, int], dtype: torch.dtype, config: object) -> nn.Linear:
    torch.manual_seed(0)
    linear = nn.Linear(shape[1], shape[0]).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao logs skipped shapes and deprecations
        quantize_(linear, config)
    return linear


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int8_matches_torchao(shape: tuple[int, int], dtype: torch.dtype) -> None:
    linear = quantized_linear(shape, dtype, Int8WeightOnlyConfig())
    assert type(linear.weight).__name__ == "Int8Tensor"
    assert stored_nbytes(linear.weight) == quantized_weight_nbytes("int8", *shape, dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int4_matches_torchao_cpu_layout(
    shape: tuple[int, int], group: int, dtype: torch.dtype
) -> None:
    linear = quantized_linear(shape, dtype, PrototypeInt4WeightOnlyConfig(group_size=group))
    quantized = shape[1] % group == 0
    assert (type(linear.weight).__name__ == "Int4OpaqueTensor") == quantized
    expected = quantized_weight_nbytes(f"int4-g{group}", *shape, dtype)
    assert stored_nbytes(linear.weight) == expected
    if not quantized:  # torchao skips a weight the group does not divide: kept as it is
        assert expected == shape[0] * shape[1] * dtype.itemsize


def test_int4_cpu_packing_needs_rows_in_sixteens() -> None:
    """torchao's CPU int4 packing rejects N % 16 != 0; our sizes count the packed layout the
    GPU paths produce for such shapes (not checkable on CPU)."""
    with pytest.raises(RuntimeError, match="dividable by 16"):
        quantized_linear((200, 320), torch.bfloat16, PrototypeInt4WeightOnlyConfig(group_size=64))


@pytest.mark.parametrize("shape", [*SHAPES, (200, 300)])
def test_fp8_matches_torchao(shape: tuple[int, int]) -> None:
    linear = quantized_linear(shape, torch.bfloat16, Float8WeightOnlyConfig())
    assert type(linear.weight).__name__ == "Float8Tensor"
    assert stored_nbytes(linear.weight) == quantized_weight_nbytes("fp8", *shape, torch.bfloat16)


@pytest.mark.parametrize("shape", [*SHAPES, (7, 9), (300, 200)])
@pytest.mark.parametrize("name", ["nf4", "nf4-dq", "fp4", "fp4-dq"])
def test_4bit_matches_bitsandbytes(shape: tuple[int, int], name: str) -> None:
    functional = pytest.importorskip(
        "bitsandbytes.functional", reason="bitsandbytes (dev extra) makes the NF4/FP4 layouts"
    )
    torch.manual_seed(0)
    weight = torch.randn(*shape, dtype=torch.bfloat16)
    packed, state = functional.quantize_4bit(
        weight, blocksize=64, compress_statistics=name.endswith("-dq"), quant_type=name[:3]
    )
    tensors = [packed, state.absmax, state.code]
    if state.state2 is not None:
        tensors += [state.state2.absmax, state.state2.code, state.offset]
    nbytes = sum(tensor.untyped_storage().nbytes() for tensor in tensors)
    assert nbytes == quantized_weight_nbytes(name, *shape, torch.bfloat16)


def test_bits_per_weight_figures() -> None:
    # int4-g128 in bf16: 4 + 2 * 2 B * 8 / 128 = 4.25; nf4: 4 + 32/64; dq: 4 + 8/64 + ~0.002
    assert bits_per_weight("int4-g128") == 4.25
    assert bits_per_weight("int4-g32") == 5.0
    assert round(bits_per_weight("nf4"), 2) == 4.5
    assert round(bits_per_weight("nf4-dq"), 3) == 4.127
    assert bits_per_weight("bf16") == 16


def tiny_blocks() -> nn.Module:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(128, 64, bias=True)
            self.norm = nn.LayerNorm(64)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Block() for _ in range(2))
            self.head = nn.Linear(64, 10, bias=False)

    return Model().to(torch.bfloat16)


def test_precision_map_applies_longest_prefix_and_keeps_the_rest() -> None:
    model = tiny_blocks()
    base = {name: t.numel() * t.element_size() for name, t in model.named_parameters()}
    weights = QuantizableWeights.of(model, keep=["head"])
    assert set(weights.shapes) == {"layers.0.proj.weight", "layers.1.proj.weight"}
    sizes = tensor_nbytes_under({"layers": "int8", "layers.1": "int4-g64"}, base, weights)
    assert sizes["layers.0.proj.weight"] == 64 * 128 + 5 * 64  # int8: N*K + 5N
    assert sizes["layers.1.proj.weight"] == 64 * 64 + 2 * 2 * 64 * 2  # N*K/2 + 2*(K/G)*N*2 B
    assert sizes["layers.0.proj.bias"] == base["layers.0.proj.bias"]
    assert sizes["head.weight"] == base["head.weight"]  # kept in high precision
    modules = module_sizes_of(sizes, [name for name, _ in model.named_modules()])
    assert modules[""] == sum(sizes.values())
    assert modules["layers.1"] == sum(v for k, v in sizes.items() if k.startswith("layers.1."))
    assert precision_of("layers.1.proj", {"": "bf16", "layers.1": "nf4"}) == "nf4"
    assert linear_weight_shapes(model)["head.weight"] == (10, 64, torch.bfloat16)


def test_default_keep_high_precision_llama_and_moe_router() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    with torch.device("meta"):
        llama = LlamaForCausalLM(
            LlamaConfig(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=100,
            )
        )
        mixtral = MixtralForCausalLM(
            MixtralConfig(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=100,
                num_local_experts=4,
            )
        )
    assert default_keep_high_precision(llama) == ["lm_head"]
    kept = default_keep_high_precision(mixtral)
    assert "lm_head" in kept
    routers = [name for name in kept if name != "lm_head"]
    assert routers and all(name.rpartition(".")[2] in ("gate", "router") for name in routers)
    assert len(routers) == 2  # one router per layer


# --- pre-quantized checkpoints, planned from their headers -------------------------------------


def tiny_llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )


@pytest.fixture(scope="module")
def bnb_checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """A real bitsandbytes NF4 (double-quantized) checkpoint, written by transformers on CPU."""
    pytest.importorskip("bitsandbytes", reason="bitsandbytes (dev extra) writes the checkpoint")
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("bnb")
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_llama_config()).to(torch.bfloat16).save_pretrained(root / "plain")
    config = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = LlamaForCausalLM.from_pretrained(
            root / "plain", quantization_config=config, device_map="cpu", dtype=torch.bfloat16
        )
    quantized.save_pretrained(root / "nf4")
    return root / "nf4"


def header_nbytes(path) -> dict[str, int]:
    from safetensors import safe_open

    sizes = {}
    with safe_open(path, "pt") as handle:
        for name in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
            part = handle.get_slice(name)
            count = 1
            for extent in part.get_shape():
                count *= extent
            itemsize = {"U8": 1, "I8": 1, "BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I64": 8}
            sizes[name] = count * itemsize[part.get_dtype()]
    return sizes


def test_bnb_checkpoint_is_planned_at_its_stored_bytes(bnb_checkpoint) -> None:
    import json

    from transformers import LlamaForCausalLM

    from workbench.big_modeling.quantization.prequantized import (
        read_quantization_config,
        stored_tensor_nbytes,
    )

    config = read_quantization_config(json.loads((bnb_checkpoint / "config.json").read_text()))
    assert config is not None and config.summary() == "bitsandbytes 4-bit, group 64"
    stored = header_nbytes(bnb_checkpoint / "model.safetensors")
    with torch.device("meta"):
        model = LlamaForCausalLM(tiny_llama_config())
    sizes, orphans = stored_tensor_nbytes(stored, model)
    assert orphans == [] and sum(sizes.values()) == sum(stored.values())
    proj = "model.layers.0.mlp.down_proj.weight"
    parts = {name: n for name, n in stored.items() if name.startswith(proj)}
    assert len(parts) == 6 and sizes[proj] == sum(parts.values())
    # our nf4-dq formula is the in-memory state: the file's parts less the JSON quant_state
    # blob, plus the 4 B float32 offset the blob carries
    blob = next(n for name, n in parts.items() if "quant_state" in name)
    assert sizes[proj] - blob + 4 == quantized_weight_nbytes("nf4-dq", 64, 128, torch.bfloat16)


def test_gptq_header_sizes_go_to_the_linear_weight(tmp_path) -> None:
    from safetensors.torch import save_file

    from workbench.big_modeling.quantization.prequantized import stored_tensor_nbytes

    n, k, group = 32, 64, 32  # GPTQ 4-bit: qweight (K/8, N) int32, qzeros (K/G, N/8) int32
    tensors = {
        "0.qweight": torch.zeros(k // 8, n, dtype=torch.int32),
        "0.qzeros": torch.zeros(k // group, n // 8, dtype=torch.int32),
        "0.scales": torch.zeros(k // group, n, dtype=torch.float16),
        "0.g_idx": torch.zeros(k, dtype=torch.int32),
        "0.bias": torch.zeros(n, dtype=torch.float16),
        "stray.tensor": torch.zeros(3, dtype=torch.float16),
    }
    save_file(tensors, tmp_path / "model.safetensors")
    model = nn.Sequential(nn.Linear(k, n))
    sizes, orphans = stored_tensor_nbytes(header_nbytes(tmp_path / "model.safetensors"), model)
    # 8*32*4 + 2*4*4 + 2*32*2 + 64*4 = 1024 + 32 + 128 + 256 = 1440 B
    assert sizes == {"0.weight": 1440, "0.bias": 64}
    assert orphans == ["stray.tensor"]


def test_quantization_config_errors_name_the_key() -> None:
    from workbench.big_modeling.errors import BadInputError
    from workbench.big_modeling.quantization.prequantized import read_quantization_config

    assert read_quantization_config({}) is None
    with pytest.raises(BadInputError, match="quant_method 'exl9' is not one"):
        read_quantization_config({"quantization_config": {"quant_method": "exl9"}})
    with pytest.raises(BadInputError, match=r"config\.json: quantization_config must be an object"):
        read_quantization_config({"quantization_config": [4]})
    awq = read_quantization_config(
        {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    )
    assert awq is not None and awq.summary() == "awq 4-bit, group 128"
    compressed = read_quantization_config(
        {
            "quantization_config": {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 64}}},
                "ignore": ["lm_head"],
            }
        }
    )
    assert compressed is not None and (compressed.bits, compressed.group_size) == (4, 64)
    assert compressed.not_converted == ("lm_head",)
