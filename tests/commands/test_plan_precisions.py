"""``workbench plan --precisions``: the joint planner from the command line, its JSON section,
and a ``quantization_config`` snippet that transformers really loads."""

from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path

import pytest
import torch

from workbench.models.hardware import load_profile
from workbench.models.intake import open_model


def _layers(demo_dir: Path) -> list[str]:
    count = open_model(demo_dir).config.num_hidden_layers
    return [f"model.layers.{i}" for i in range(count)]


def _bandwidth_only(tmp_path: Path, name: str) -> Path:
    """The bundled profile ``name`` without the host's dispatch cost, which for a demo this
    small is the whole GPU step and leaves no reason to quantize."""
    data = {**load_profile(name).to_dict(), "module_call_us": 0, "forward_call_us": 0}
    path = tmp_path / f"{name}-bandwidth-only.json"
    path.write_text(json.dumps(data))
    return path


def test_json_has_a_quantization_section_and_a_plain_map(
    cli, demo_dir: Path, tmp_path: Path
) -> None:
    code, out, err = cli(
        "plan",
        str(demo_dir),
        "--profile",
        str(_bandwidth_only(tmp_path, "rtx4090-64gb")),
        "--precisions",
        "int4,int8,bf16",
        "--min-bits",
        "6",
        "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    section = data["quantization"]
    assert set(section["precision_map"]) == set(_layers(demo_dir))
    assert set(section["precision_map"].values()) <= {"int4-g128", "int8", "bfloat16"}
    assert section["average_bits"] >= 6
    assert all(isinstance(device, int | str) for device in data["device_map"].values())
    # the speed printed is the one the planner maximised, on the quantized sizes
    assert section["tokens_per_s"] == data["speed"]["tokens_per_s"]
    assert len(section["candidates"]) >= 3
    for candidate in section["candidates"]:  # every candidate under the minimum is refused
        assert candidate["feasible"] == (candidate["average_bits"] >= 6), candidate["label"]
    assert section["trace"][0].startswith("chose ")
    assert sum(data["per_device_bytes"].values()) < open_model(demo_dir).tree.root.nbytes


def test_keep_at_least_holds_the_first_layer(cli, demo_dir: Path) -> None:
    code, out, err = cli(
        "plan",
        str(demo_dir),
        "--max-memory",
        "cpu=1GiB",
        "--precisions",
        "int4,int8",
        "--keep-at-least",
        "first=bf16",
        "--json",
    )
    assert code == 0, err
    precision_map = json.loads(out)["quantization"]["precision_map"]
    layers = _layers(demo_dir)
    assert precision_map[layers[0]] == "bfloat16"
    assert set(precision_map[name] for name in layers[1:]) <= {"int4-g128", "int8"}


def test_text_output_explains_the_choice(cli, demo_dir: Path) -> None:
    code, out, err = cli("plan", str(demo_dir), "--max-memory", "cpu=1GiB", "--precisions", "int8")
    assert code == 0, err
    assert "precision  int8" in out and "why        chose int8 everywhere" in out
    # the total is int8-sized: the first line says so, not the model's dtype alone
    layers = len(_layers(demo_dir))
    dtype = json.loads((demo_dir / "config.json").read_text())["dtype"]
    header = out.splitlines()[0]
    assert f" (int8 on {layers} layers; {dtype} elsewhere), strategy auto" in header, header


def test_bad_precision_flags_are_named(cli, demo_dir: Path) -> None:
    code, _, err = cli("plan", str(demo_dir), "--min-bits", "4.5")
    assert code != 0 and "--min-bits and --keep-at-least need --precisions" in err
    code, _, err = cli("plan", str(demo_dir), "--precisions", "int3")
    assert code != 0 and "unknown precision 'int3'" in err
    code, _, err = cli("plan", str(demo_dir), "--precisions", "int8", "--keep-at-least", "first")
    assert code != 0 and "LAYERS=PRECISION" in err


def test_emitted_code_loads_quantized_with_transformers(cli, demo_dir: Path) -> None:
    code, out, err = cli(
        "plan",
        str(demo_dir),
        "--max-memory",
        "cpu=1GiB",
        "--precisions",
        "int8",  # int8 only: with float16 allowed, float16 is faster on a CPU (kernel costs)
        "--keep-at-least",
        "last=float16",
        "--emit-code",
        "--json",
    )
    assert code == 0, err
    snippet = json.loads(out)["code"]
    ast.parse(snippet)
    assert "quantization_config=quantization_config" in snippet and "TorchAoConfig" in snippet
    namespace: dict[str, object] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao / transformers deprecation notes
        exec(snippet, namespace)
    model = namespace["model"]
    layers = _layers(demo_dir)
    first = model.get_submodule(f"{layers[0]}.self_attn.q_proj").weight
    last = model.get_submodule(f"{layers[-1]}.self_attn.q_proj").weight
    assert type(first).__name__ == "Int8Tensor"
    assert type(last) is torch.nn.Parameter and last.dtype == torch.float16
    assert type(model.lm_head.weight) is torch.nn.Parameter  # kept in high precision


def test_prequantized_checkpoint_is_planned_at_stored_sizes(cli, tmp_path: Path) -> None:
    pytest.importorskip("bitsandbytes", reason="bitsandbytes (dev extra) writes the checkpoint")
    from safetensors import safe_open
    from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path / "plain")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        LlamaForCausalLM.from_pretrained(
            tmp_path / "plain",
            quantization_config=BitsAndBytesConfig(load_in_4bit=True),
            device_map="cpu",
            dtype=torch.bfloat16,
        ).save_pretrained(tmp_path / "nf4")
    stored = {}
    for name in ("plain", "nf4"):
        with safe_open(tmp_path / name / "model.safetensors", "pt") as handle:
            keys = list(handle.keys())
            stored[name] = sum(handle.get_tensor(key).nbytes for key in keys)
    code, out, err = cli("plan", str(tmp_path / "plain"), "--max-memory", "cpu=1GiB", "--json")
    assert code == 0, err
    buffers = sum(json.loads(out)["per_device_bytes"].values()) - stored["plain"]  # rotary
    code, out, err = cli("plan", str(tmp_path / "nf4"), "--max-memory", "cpu=1GiB", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["quantization"]["prequantized"].startswith("bitsandbytes 4-bit")
    assert data["quantization"]["quantization_config"]["bnb_4bit_quant_type"] == "fp4"
    assert sum(data["per_device_bytes"].values()) == stored["nf4"] + buffers
    code, _, err = cli("plan", str(tmp_path / "nf4"), "--precisions", "int4")
    assert code != 0 and "stored quantized (bitsandbytes 4-bit" in err


def test_quantization_config_code_per_library() -> None:
    from workbench.runtime import BadInputError
    from workbench.runtime.quantization_code import quantization_config_code

    nf4 = "\n".join(quantization_config_code({"m.0": "nf4-dq", "m.1": "nf4-dq"}, ["lm_head"]))
    assert "BitsAndBytesConfig(" in nf4 and "bnb_4bit_quant_type='nf4'" in nf4
    assert "bnb_4bit_use_double_quant=True" in nf4 and "['lm_head']" in nf4
    mixed = "\n".join(quantization_config_code({"m.0": "int4-g64", "m.1": "fp8", "m.2": "bf16"}))
    assert "Int4WeightOnlyConfig(group_size=64)" in mixed and "Float8WeightOnlyConfig()" in mixed
    assert "modules_to_not_convert=['m.2']" in mixed
    ast.parse(mixed)
    assert quantization_config_code({"m.0": "bf16"}) == []
    with pytest.raises(BadInputError, match="one format per model"):
        quantization_config_code({"m.0": "nf4", "m.1": "int8"})


def test_the_reserve_is_the_joint_maps_own(cli) -> None:
    """The 70B's bf16 plan offloads layers 1-79; its int4 plan keeps layers 0-2 on the GPU:
    the reserve printed (and kept) is what the int4 map's layers need, not the bf16 map's."""
    from workbench.runtime.planning import MemoryOptions, device_reserves

    code, out, err = cli(
        "plan", "llama-3.1-70b", "--profile", "rtx4090-64gb", "--precisions", "int4,bf16",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    needed = device_reserves(open_model("llama-3.1-70b"), data["device_map"], MemoryOptions())
    assert data["reserve_why"] == {str(device): r.why for device, r in needed.items()}
    assert {str(k): v for k, v in data["reserve"].items()} == {
        str(device): r.nbytes for device, r in needed.items()
    }
