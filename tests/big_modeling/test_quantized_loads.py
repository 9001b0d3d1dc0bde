"""Real quantized loads on the CPU: a mixed precision map over a cpu + disk device map.

The checkpoint is a real demo Llama (``make_demo``, 2M parameters, bf16, two safetensors shards;
hidden 192, intermediate 512, 4 layers) written once per module. torchao quantizes: int8
(``Int8Tensor``) and int4 (``Int4OpaqueTensor``, the CPU tinygemm layout). Disk layers are packed
once into the offload folder and rebuilt by the hook on each forward.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from torchao.prototype.quantization.int4 import Int4OpaqueTensor
from torchao.quantization import Int8Tensor
from transformers import AutoConfig, AutoModelForCausalLM

from workbench.big_modeling import init_empty_weights, load_checkpoint_and_dispatch
from workbench.big_modeling.errors import BadInputError, CheckpointError
from workbench.big_modeling.loading.api import load_checkpoint_in_model
from workbench.big_modeling.offload.folder import OffloadedWeightsLoader
from workbench.big_modeling.quantization.apply import quantize_model, resolve_precision_map
from workbench.big_modeling.quantization.packed import stored_nbytes
from workbench.big_modeling.quantization.sizes import quantized_weight_nbytes
from workbench.models.demo import make_demo

DEVICE_MAP = {
    "model.embed_tokens": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "cpu",
    "model.layers.2": "disk",
    "model.layers.3": "disk",
    "model.norm": "cpu",
    "model.rotary_emb": "cpu",
    "lm_head": "cpu",
}
# int8 and int4 on both tiers; bf16 for embeddings, norms, lm_head and layer 1's attention.
PRECISION_MAP = {
    "": "bfloat16",
    "model.layers.0": "int8",
    "model.layers.1.mlp": "int4-g64",
    "model.layers.2": "int4-g32",
    "model.layers.3": "int8",
}
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo(
        tmp_path_factory.mktemp("quantized") / "demo", params="2M", shards=2, dtype="bfloat16"
    )


def empty_model(folder: Path) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(folder)
    with init_empty_weights():
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()


def load_on_both_tiers(
    folder: Path, offload: Path, precision_map: dict[str, str]
) -> tuple[torch.nn.Module, Any]:
    """The demo loaded along ``DEVICE_MAP`` (cpu and disk) and quantized per ``precision_map``;
    the model and ``quantize_model``'s report."""
    model = empty_model(folder)
    load_checkpoint_in_model(model, folder, device_map=DEVICE_MAP, offload_folder=offload)
    return model, quantize_model(model, precision_map, offload_folder=offload)


def load_mixed(folder: Path, offload: Path) -> torch.nn.Module:
    return load_checkpoint_and_dispatch(
        empty_model(folder),
        folder,
        device_map=DEVICE_MAP,
        offload_folder=offload,
        precision_map=PRECISION_MAP,
    )


def module(model: torch.nn.Module, layer: int, name: str) -> torch.nn.Module:
    block = model.model.layers[layer]
    part = block.self_attn if name in LINEARS[:4] else block.mlp
    return getattr(part, name)


def safetensors_data_nbytes(path: Path) -> int:
    """Bytes of tensor data in a safetensors file (file size minus the 8-byte length and header)."""
    raw = path.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    return sum(
        end - start
        for key, info in header.items()
        if key != "__metadata__"
        for start, end in [info["data_offsets"]]
    )


def test_mixed_map_loads_dispatches_and_generates(demo_folder: Path, tmp_path: Path) -> None:
    model = load_mixed(demo_folder, tmp_path / "offload")
    assert isinstance(module(model, 0, "q_proj").weight, Int8Tensor)
    assert isinstance(module(model, 1, "up_proj").weight, Int4OpaqueTensor)
    assert module(model, 1, "q_proj").weight.dtype == torch.bfloat16  # attention kept bf16
    assert type(module(model, 1, "q_proj").weight) is torch.nn.Parameter
    assert module(model, 2, "up_proj").weight.device.type == "meta"  # disk: placeholder only

    seen: dict[str, type] = {}

    def record(mod: torch.nn.Module, label: str) -> None:
        inner = mod._old_forward  # runs inside the dispatch hook, after it brought weights in

        def forward(x: torch.Tensor) -> torch.Tensor:
            seen[label] = type(mod.weight)
            return inner(x)

        mod._old_forward = forward

    record(module(model, 2, "up_proj"), "disk int4")
    record(module(model, 3, "down_proj"), "disk int8")
    ids = torch.tensor([[1, 17, 42, 99, 5, 230]])
    out = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert out.shape == (1, 12)
    assert seen == {"disk int4": Int4OpaqueTensor, "disk int8": Int8Tensor}
    assert module(model, 2, "up_proj").weight.device.type == "meta"  # and back out after


def test_disk_layers_are_packed_once_and_read_lazily(demo_folder: Path, tmp_path: Path) -> None:
    offload = tmp_path / "offload"
    model = load_mixed(demo_folder, offload)
    index = json.loads((offload / "index.json").read_text())
    packed_files = sorted(offload.glob("*.quantized-*.safetensors"))
    assert len(packed_files) == 2 * len(LINEARS)  # one per disk Linear, written once
    for layer, kind in ((2, "Int4OpaqueTensor"), (3, "Int8Tensor")):
        entry = index[f"model.layers.{layer}.mlp.up_proj.weight"]
        assert entry["torchao"]["type"] == kind
        assert entry["dtype"] == "bfloat16" and entry["shape"] == [512, 192]
    # norms of disk layers stay plain pointers into the checkpoint (nothing copied)
    assert "safetensors_file" in index["model.layers.2.input_layernorm.weight"]

    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in offload.iterdir()}
    with torch.inference_mode():
        model(torch.tensor([[3, 4, 5]]))
        model(torch.tensor([[6, 7, 8]]))
    after = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in offload.iterdir()}
    assert after == before  # forwards read the packed files, never rewrite them


def test_a_second_quantized_load_replaces_the_packed_files(
    demo_folder: Path, tmp_path: Path
) -> None:
    offload = tmp_path / "offload"
    load_mixed(demo_folder, offload)
    first = {p.name for p in offload.glob("*.quantized-*.safetensors")}
    model = load_mixed(demo_folder, offload)
    second = {p.name for p in offload.glob("*.quantized-*.safetensors")}
    assert len(second) == len(first) and not first & second  # old ones removed, none doubled
    with torch.inference_mode():
        assert torch.isfinite(model(torch.tensor([[3, 4, 5]])).logits).all()


def test_measured_bytes_per_tier_match_the_packed_tensors(
    demo_folder: Path, tmp_path: Path
) -> None:
    """Measured from torchao's tensors and the files on disk, against the planner's sizes."""
    offload = tmp_path / "offload"
    model, report = load_on_both_tiers(demo_folder, offload, PRECISION_MAP)

    # Hand arithmetic for two weights (bf16 192 x 192 = 73,728 B before):
    # int8 per channel: 192*192 int8 + 192 fp32 scales + 192 int8 zero points
    #   = 36,864 + 768 + 192 = 37,824 B
    # int4 g32, CPU layout: 192*192/2 packed + (192/32 groups)*192*(scale, zero) bf16
    #   = 18,432 + 6*192*2*2 = 23,040 B
    by_name = {m.name: m for m in report.modules}
    assert by_name["model.layers.0.self_attn.q_proj"].weight_nbytes == 37_824
    assert by_name["model.layers.2.self_attn.q_proj"].weight_nbytes == 23_040
    assert by_name["model.layers.2.self_attn.q_proj"].original_nbytes == 73_728

    cpu_measured = sum(
        stored_nbytes(module(model, layer, name).weight) for layer in (0, 1) for name in LINEARS
    )
    cpu_reported = sum(
        m.weight_nbytes for m in report.modules if m.tier == "cpu" and ".layers." in m.name
    )
    assert cpu_measured == cpu_reported
    disk_on_disk = sum(safetensors_data_nbytes(p) for p in report.packed_files)
    assert disk_on_disk == report.nbytes_by_tier()["disk"]
    linears = dict(model.named_modules())
    for m in report.modules:  # the planner's prediction (quantization/sizes.py), per weight
        rows, columns = linears[m.name].out_features, linears[m.name].in_features
        predicted = quantized_weight_nbytes(m.precision, rows, columns, torch.bfloat16)
        assert m.weight_nbytes == predicted, m.name
    assert report.nbytes_by_tier()["disk"] < 0.5 * sum(
        m.original_nbytes for m in report.modules if m.tier == "disk"
    )


def test_bfloat16_map_leaves_the_load_bitwise_unchanged(demo_folder: Path, tmp_path: Path) -> None:
    plain = load_checkpoint_and_dispatch(
        empty_model(demo_folder), demo_folder, device_map=DEVICE_MAP, offload_folder=tmp_path / "a"
    )
    same = load_checkpoint_and_dispatch(
        empty_model(demo_folder),
        demo_folder,
        device_map=DEVICE_MAP,
        offload_folder=tmp_path / "b",
        precision_map={"": "bf16"},
    )
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        assert torch.equal(plain(ids).logits, same(ids).logits)


def test_tied_and_indivisible_weights_are_skipped_with_reasons(
    demo_folder: Path, tmp_path: Path
) -> None:
    model = empty_model(demo_folder)
    load_checkpoint_in_model(model, demo_folder, device_map={"": "cpu"})
    model.lm_head.weight = model.model.embed_tokens.weight
    report = quantize_model(model, {"": "int4-g128"})
    reasons = dict(report.skipped)
    assert "tied" in reasons["lm_head"]
    assert (
        "192 is not a multiple of the int4 group size 128"
        in reasons["model.layers.0.self_attn.q_proj"]
    )
    assert isinstance(module(model, 0, "down_proj").weight, Int4OpaqueTensor)  # 512 % 128 == 0


def test_bad_precisions_and_missing_offload_folder_are_named(
    demo_folder: Path, tmp_path: Path
) -> None:
    model = empty_model(demo_folder)
    load_checkpoint_in_model(
        model, demo_folder, device_map=DEVICE_MAP, offload_folder=tmp_path / "offload"
    )
    with pytest.raises(BadInputError, match="unknown precision 'int3'"):
        quantize_model(model, {"model.layers.0": "int3"})
    with pytest.raises(
        CheckpointError, match=r"model\.layers\.2\.self_attn\.q_proj\.weight is on the meta"
    ):
        quantize_model(model, {"model.layers.2": "int8"})


def test_a_tampered_packed_record_fails_naming_the_entry(demo_folder: Path, tmp_path: Path) -> None:
    offload = tmp_path / "offload"
    model = load_mixed(demo_folder, offload)
    path = offload / "index.json"
    index = json.loads(path.read_text())
    index["model.layers.2.mlp.up_proj.weight"]["torchao"]["type"] = "os.system"
    path.write_text(json.dumps(index))
    # the dispatched model read its index at dispatch; a new reader reads the tampered one
    weights = OffloadedWeightsLoader(save_folder=offload)
    with pytest.raises(
        CheckpointError, match=r"'model\.layers\.2\.mlp\.up_proj\.weight'.*os\.system"
    ):
        weights["model.layers.2.mlp.up_proj.weight"]
    del model


def test_quantize_option_keeps_the_default_high_precision_modules(demo_folder: Path) -> None:
    model = empty_model(demo_folder)
    assert resolve_precision_map(model, quantize="int4") == {
        "": "int4-g128",
        "lm_head": "bfloat16",  # transformers' get_keys_to_not_convert default
    }
    assert resolve_precision_map(model, {"model.layers": "INT8"}) == {"model.layers": "int8"}
    assert resolve_precision_map(model) == {}
    with pytest.raises(BadInputError, match="not both"):
        resolve_precision_map(model, {"": "int8"}, "int8")
