"""Fused MoE experts (transformers 5's 3-D ``experts.gate_up_proj [E, 2I, H]``) quantized on CPU.

Tiny Mixtral and Qwen2-MoE models are built on the CPU in bf16 and written as one safetensors
file under the model's own tensor names; layer 0 loads to cpu (quantized in place), layer 1 to
disk (packed into the offload folder). Bytes are counted from the real tensors and compared with
``QuantizableWeights`` / ``tensor_nbytes_under``, the sizes the planner uses.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torchao.quantization import Float8Tensor, Int8Tensor
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    MixtralConfig,
    PretrainedConfig,
    Qwen2MoeConfig,
)

from workbench.big_modeling import dispatch_model, init_empty_weights, load_checkpoint_and_dispatch
from workbench.big_modeling.loading.api import load_checkpoint_in_model
from workbench.big_modeling.quantization.apply import quantize_model
from workbench.big_modeling.quantization.experts import Int4ExpertsTensor, fused_expert_shapes
from workbench.big_modeling.quantization.packed import stored_nbytes
from workbench.big_modeling.quantization.sizes import QuantizableWeights, tensor_nbytes_under

pytest.importorskip("bitsandbytes", reason="nf4 experts need bitsandbytes (dev extra)")

SMALL = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "tie_word_embeddings": False,
}
CONFIGS = {
    "mixtral": MixtralConfig(
        intermediate_size=128, num_local_experts=4, num_experts_per_tok=2, **SMALL
    ),
    "qwen2_moe": Qwen2MoeConfig(
        intermediate_size=128,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=128,
        num_experts=4,
        num_experts_per_tok=2,
        **SMALL,
    ),
}
DEVICE_MAP = {
    "model.embed_tokens": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.norm": "cpu",
    "model.rotary_emb": "cpu",
    "lm_head": "cpu",
}
IDS = torch.tensor([[1, 5, 9, 33, 7, 100, 42, 3]])
EXPECTED_TYPE = {
    "int8": Int8Tensor,
    "fp8": Float8Tensor,
    "int4-g32": Int4ExpertsTensor,
    "nf4": "Bnb4bitTensor",
    "fp4-dq": "Bnb4bitTensor",
}


def write_checkpoint(folder: Path, config: PretrainedConfig) -> Path:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    folder.mkdir(parents=True)
    config.save_pretrained(folder)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("moe") / request.param, CONFIGS[request.param])


@pytest.fixture(scope="module")
def reference_logits(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> torch.Tensor:
    """The bf16 model's logits, loaded over the same cpu + disk map."""
    model = load_checkpoint_and_dispatch(
        empty_model(checkpoint),
        checkpoint,
        device_map=DEVICE_MAP,
        offload_folder=tmp_path_factory.mktemp("plain"),
    )
    return logits(model)


def empty_model(folder: Path) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(folder)
    with init_empty_weights():
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.inference_mode():
        return model(IDS).logits.float()


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("precision", sorted(EXPECTED_TYPE))
def test_fused_experts_are_quantized_sized_and_run(
    checkpoint: Path, reference_logits: torch.Tensor, tmp_path: Path, precision: str
) -> None:
    offload = tmp_path / "b"
    model = empty_model(checkpoint)
    load_checkpoint_in_model(model, checkpoint, device_map=DEVICE_MAP, offload_folder=offload)
    precision_map = {"": "bfloat16", "model.layers": precision}
    report = quantize_model(model, precision_map, offload_folder=offload)

    experts = model.model.layers[0].mlp.experts
    expected = EXPECTED_TYPE[precision]
    for weight in (experts.gate_up_proj, experts.down_proj):
        kind = type(weight) if isinstance(expected, type) else type(weight).__name__
        assert kind == expected
    assert model.model.layers[1].mlp.experts.gate_up_proj.device.type == "meta"  # disk

    meta = empty_model(checkpoint)
    planned = tensor_nbytes_under(
        precision_map,
        {name: t.numel() * t.element_size() for name, t in meta.state_dict().items()},
        QuantizableWeights.of(meta),
    )
    by_name = {m.name: m for m in report.modules}
    expert_names = sorted(fused_expert_shapes(meta))
    assert len(expert_names) == 4  # gate_up_proj and down_proj of two layers
    for name in expert_names:
        assert by_name[name].weight_nbytes == planned[name], name
        assert by_name[name].weight_nbytes < 0.55 * by_name[name].original_nbytes
    for name, parameter in model.named_parameters():
        if name in expert_names and parameter.device.type != "meta":
            assert stored_nbytes(parameter) == planned[name]
            inner, _ = parameter.__tensor_flatten__()
            storages = sum(getattr(parameter, part).untyped_storage().nbytes() for part in inner)
            assert storages == planned[name]

    dispatched = dispatch_model(model, device_map=DEVICE_MAP, offload_dir=offload)
    error = relative_error(logits(dispatched), reference_logits)
    bound = 0.12 if precision in ("int8", "fp8") else 0.35
    assert 0 < error < bound, error


def test_expert_forward_uses_exactly_the_quantized_weights(checkpoint: Path) -> None:
    """The eager experts forward on quantized weights equals it on their dequantized copies."""
    model = empty_model(checkpoint)
    load_checkpoint_in_model(model, checkpoint, device_map={"": "cpu"})
    quantize_model(model, {"model.layers.0.mlp.experts": "int4-g64"})
    experts = model.model.layers[0].mlp.experts
    assert isinstance(experts.gate_up_proj, Int4ExpertsTensor)
    assert model.config._experts_implementation == "eager"

    def dequantized_weight(weight: torch.Tensor) -> torch.Tensor:
        """W from the int4 kernel itself: linear(I, W) = W^T (Int4OpaqueTensor has no dequantize)."""
        eye = torch.eye(weight.shape[1], dtype=torch.bfloat16)
        return torch.nn.functional.linear(eye, weight).t().contiguous()

    with torch.inference_mode():
        dequantized = {
            attr: torch.stack([dequantized_weight(getattr(experts, attr)[e]) for e in range(4)])
            for attr in ("gate_up_proj", "down_proj")
        }
    torch.manual_seed(1)
    hidden = torch.randn(6, 128, dtype=torch.bfloat16)
    top_k = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0], [0, 2], [1, 3]])
    weights = torch.full((6, 2), 0.5, dtype=torch.bfloat16)
    with torch.inference_mode():
        got = experts(hidden, top_k, weights)
        for attr, value in dequantized.items():
            setattr(experts, attr, torch.nn.Parameter(value, requires_grad=False))
        want = experts(hidden, top_k, weights)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_planned_int4_bytes_count_the_experts(checkpoint: Path) -> None:
    """Before this, a MoE int4 plan left the experts (most of the bytes) at bf16."""
    meta = empty_model(checkpoint)
    weights = QuantizableWeights.of(meta)
    shapes = fused_expert_shapes(meta)
    assert weights.experts == {name: shape[0] for name, shape in shapes.items()}
    base = {name: t.numel() * t.element_size() for name, t in meta.state_dict().items()}
    planned = tensor_nbytes_under({"": "int4-g64"}, base, weights)
    expert_before = sum(base[name] for name in shapes)
    expert_after = sum(planned[name] for name in shapes)
    # int4-g64 in bf16: 4 bits + 2 * 16 bits per 64 weights = 4.5 bits, against 16
    assert expert_after == expert_before * 4.5 / 16


def test_int4_skips_rows_the_cpu_packing_cannot_take(tmp_path: Path) -> None:
    """Qwen2-MoE's ``shared_expert_gate`` is Linear(H, 1): torchao's CPU int4 packing needs
    N % 16 == 0, so it is kept as loaded with a reason instead of failing the load."""
    folder = write_checkpoint(tmp_path / "qwen", CONFIGS["qwen2_moe"])
    model = empty_model(folder)
    load_checkpoint_in_model(model, folder, device_map={"": "cpu"})
    report = quantize_model(model, {"model.layers.0": "int4-g32"})
    reasons = dict(report.skipped)
    assert "not a multiple of 16" in reasons["model.layers.0.mlp.shared_expert_gate"]
    assert isinstance(model.model.layers[0].mlp.experts.down_proj, Int4ExpertsTensor)
    assert type(model.model.layers[0].mlp.shared_expert_gate.weight) is torch.nn.Parameter
