"""``workbench plan``: cpu+disk maps on demo checkpoints, what-if GPUs, code export, bad input."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from workbench.big_modeling import infer_auto_device_map
from workbench.big_modeling.device_map.files import load_device_map
from workbench.models.demo import make_demo
from workbench.models.intake import open_model
from workbench.runtime.planning import MemoryOptions, device_reserves, execution_reserve


def _layer_nbytes(demo_dir: Path) -> int:
    return open_model(demo_dir).tree.node("model.layers.0").nbytes


def _cpu_reserve(folder: Path) -> int:
    """The default reserve of a cpu-only plan: the CPU runs every layer, so it keeps their KV
    cache and the prefill's activation peak (the GUI's default memory options)."""
    return execution_reserve(open_model(folder), MemoryOptions())


def test_the_default_reserve_is_the_guis_and_no_reserve_is_the_references(
    cli, demo_dir: Path
) -> None:
    opened = open_model(demo_dir)
    reserve = _cpu_reserve(demo_dir)
    # the 2M demo: 4 layers x 512 tokens (its maximum) x 3 KV heads x (64 + 64) x 2 B = 1.5 MiB
    # of cache, plus a 512-token prefill's peak (activation_peak's figure)
    (expected,) = device_reserves(opened, {"": "cpu"}, MemoryOptions()).values()
    assert expected.kv_nbytes == 4 * 512 * 3 * 128 * 2 == 1.5 * 2**20
    assert reserve == expected.kv_nbytes + expected.activation_nbytes
    budget = ["--max-memory", f"cpu={opened.tree.root.nbytes}", "disk=1GiB", "--json"]
    code, out, err = cli("plan", str(demo_dir), *budget)
    assert code == 0, err
    planned = json.loads(out)
    assert planned["reserve"] == {"cpu": reserve} and planned["memory"]["prefill_tokens"] == 512
    # the reserve pushes weights to disk: the cpu holds at most its budget less the reserve
    assert planned["per_device_bytes"].get("cpu", 0) <= opened.tree.root.nbytes - reserve
    assert planned["per_device_bytes"]["disk"] > 0
    assert planned["reserve_why"]["cpu"].startswith("layers 0-3 on cpu (layers 0-3 offloaded")
    assert "need 1.5 MiB of KV cache at 512 context" in planned["reserve_why"]["cpu"]
    code, out, err = cli("plan", str(demo_dir), *budget, "--no-reserve")
    assert code == 0, err
    bare = json.loads(out)
    assert bare["reserve"] == {} and bare["memory"] is None and bare["reserve_why"] == {}
    reference = infer_auto_device_map(
        opened.model,
        max_memory={"cpu": opened.tree.root.nbytes, "disk": 2**30},
        no_split_module_classes=opened.no_split_modules,
    )
    assert bare["device_map"] == reference == {"": "cpu"}


def test_no_reserve_refuses_memory_flags(cli, demo_dir: Path) -> None:
    code, out, err = cli("plan", str(demo_dir), "--no-reserve", "--prefill-tokens", "64")
    assert (code, out) == (2, "")
    assert "--no-reserve plans without a reserve; drop it or --prefill-tokens" in err
    code, _, err = cli("plan", str(demo_dir), "--no-reserve", "--reserve", "cpu=1MiB")
    assert code == 2 and "drop it or --reserve" in err


def test_cpu_and_disk_map_written_and_valid(cli, demo_dir: Path, tmp_path: Path) -> None:
    layer = _layer_nbytes(demo_dir)
    out_path = tmp_path / "map.json"
    # room on the cpu for about two decoder layers beside the reserve; the rest goes to disk
    code, out, err = cli(
        "plan",
        str(demo_dir),
        "--max-memory",
        f"cpu={int(2.5 * layer) + _cpu_reserve(demo_dir)}",
        "disk=1GiB",
        "-o",
        str(out_path),
    )
    assert code == 0, err
    device_map = load_device_map(out_path, model=open_model(demo_dir).model)
    assert set(device_map.values()) == {"cpu", "disk"}
    assert device_map["lm_head"] == "disk"
    assert "cpu " in out and "disk " in out and f"wrote      {out_path}" in out
    assert "predicted " in out and "tok/s" in out and "disk-bound" not in out.split("predicted")[0]


def test_json_totals_add_up(cli, demo_dir: Path) -> None:
    layer = _layer_nbytes(demo_dir)
    reserve = _cpu_reserve(demo_dir)
    budget = f"cpu={int(2.5 * layer) + reserve}"
    code, out, _ = cli("plan", str(demo_dir), "--max-memory", budget, "--json")
    assert code == 0
    data = json.loads(out)
    opened = open_model(demo_dir)
    assert sum(data["per_device_bytes"].values()) == opened.tree.root.nbytes
    assert data["per_device_bytes"]["cpu"] <= 2.5 * layer
    assert data["reserve"] == {"cpu": reserve}
    assert data["speed"]["tokens_per_s"] > 0
    assert data["speed"]["per_layer"][0]["name"] == "model.embed_tokens"


def test_what_if_profile_plans_gpus_this_machine_lacks(cli) -> None:
    code, out, err = cli(
        "plan", "llama-3.1-8b", "--profile", "2x-h100-80gb", "--strategy", "balanced", "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert set(data["device_map"].values()) == {0, 1}  # both what-if GPUs used, nothing offloaded
    assert data["profile"] == "2x-h100-80gb" and data["dtype"] == "bfloat16"
    # 8.03e9 params * 2 B over 2 GPUs, each a few GiB
    assert abs(data["per_device_bytes"]["0"] - data["per_device_bytes"]["1"]) < 2 * 2**30
    # batch-1 decode reads 16 GB of weights at 3.35 TB/s, far longer than its 16 GFLOP take
    assert data["speed"]["bottleneck"] == "memory"


def test_override_profile_budget_and_emit_code(cli) -> None:
    code, out, err = cli(
        "plan",
        "llama-3.1-8b",
        "--profile",
        "rtx4090-64gb",
        "--max-memory",
        "0=8GiB",
        "--reserve",
        "0=1GiB",
        "--emit-code",
    )
    assert code == 0, err
    assert "cuda:0" in out and "/ 8 GiB" in out and "reserve 1 GiB" in out
    code_text = out[out.index("import torch") :]
    compile(code_text, "<emitted>", "exec")  # valid Python
    assert "LlamaForCausalLM.from_pretrained(" in code_text
    assert "'meta-llama/Llama-3.1-8B'" in code_text
    assert "max_memory = {0: '8GiB', 'cpu': '64GiB', 'disk': '2000GB'}" in code_text
    assert "dtype=torch.bfloat16" in code_text and "'model.layers.0': 0," in code_text


def test_auto_reserve_comes_from_the_config(cli) -> None:
    from workbench.runtime.planning import MemoryOptions, device_reserves

    code, out, err = cli(
        "plan", "llama-3.1-8b", "--profile", "rtx4090-64gb", "--reserve", "auto", "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    # Llama 3.1 8B at its 131072 maximum capped to 32768 tokens, bf16; every layer runs on the
    # 4090 (the offloaded ones too), so it keeps all 32 caches: 32 * 32768 * 8 kv heads *
    # (128 + 128) * 2 B = 4 GiB, plus a 32k prefill's peak: residual 4 * 32768 * 4096 * 2
    # = 1 GiB + MLP 3 * 32768 * 14336 * 2 = 2.625 GiB -> 7.625 GiB (activation_peak may add
    # small terms: within 1%)
    assert data["reserve"]["0"] == pytest.approx(7.625 * 2**30, rel=0.01)
    assert data["memory"]["context"] == 32768
    expected = device_reserves(open_model("llama-3.1-8b"), data["device_map"], MemoryOptions())
    assert expected[0].kv_nbytes == 4 * 2**30
    assert data["reserve"] == {str(d): r.nbytes for d, r in expected.items()}  # the lanes' figure
    assert data["per_device_bytes"]["0"] <= 24 * 2**30 - data["reserve"]["0"]


def test_no_flags_plan_with_the_same_reserve_as_reserve_auto(cli) -> None:
    args = ("plan", "llama-3.1-8b", "--profile", "rtx4090-64gb", "--json")
    code, out, err = cli(*args)
    assert code == 0, err
    default = json.loads(out)
    code, out, err = cli(*args, "--reserve", "auto")
    assert code == 0, err
    assert default == json.loads(out)
    assert default["memory"] == {"batch": 1, "context": 32768, "context_cap": 32768,
                                 "kv_dtype": "model", "engine": "transformers",
                                 "prefill_tokens": 32768}  # fmt: skip


def test_prefill_chunks_shrink_the_activation_reserve(cli) -> None:
    code, out, err = cli(
        "plan", "llama-3.1-8b", "--profile", "rtx4090-64gb", "--prefill-tokens", "2048", "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    options = MemoryOptions(prefill_tokens=2048)
    (reserve,) = device_reserves(open_model("llama-3.1-8b"), data["device_map"], options).values()
    # the 4 GiB cache of 32 layers at 32k is the same; the peak is a 2048-token forward's:
    # residual 4 x 2048 x 4096 x 2 B = 64 MiB + MLP 3 x 2048 x 14336 x 2 B = 168 MiB today
    # (activation_peak's figures; the test reads them from device_reserves)
    assert reserve.kv_nbytes == 4 * 2**30 and reserve.activation_nbytes < 2**30
    assert data["reserve"] == {"0": reserve.nbytes}
    assert data["memory"]["prefill_tokens"] == 2048
    assert data["reserve_why"]["0"].endswith("for 2k-token prefill chunks")
    code, out, err = cli("plan", "llama-3.1-8b", "--max-memory", "0=80GiB", "--prefill-tokens",
                         "2048", "--context", "1024")  # fmt: skip
    assert code == 0, err
    assert "prefill chunks" not in out  # a chunk longer than the context: one prefill of it


def test_memory_flags_print_why_and_mix_with_no_sizes(cli) -> None:
    code, out, err = cli(
        "plan", "llama-3.1-8b", "--max-memory", "0=80GiB", "--context", "8192", "--batch", "2"
    )
    assert code == 0, err
    # 32 layers * 2 sequences * 8192 tokens * 8 * 256 * 2 B = 2 GiB of cache on cuda:0
    assert "why        layers 0-31 on cuda:0 need 2 GiB of KV cache at 8k context, bf16" in out
    code, _, err = cli("plan", "llama-3.1-8b", "--reserve", "0=1GiB", "--context", "8192")
    assert code == 2 and "drop --reserve DEVICE=SIZE or those flags" in err


def test_bad_inputs_exit_2(cli, demo_dir: Path) -> None:
    cases = [
        (["--max-memory", "cpu64GiB"], "must look like DEVICE=SIZE"),
        (["--max-memory", "cpu=lots"], "'lots' is not a memory size"),
        (["--max-memory", "gpu0=1GiB"], "'gpu0' is not a device"),
        (["--max-memory", "cpu=1GiB", "cpu=2GiB"], "gives device 'cpu' twice"),
        (["--profile", "rtx5090"], "unknown hardware profile 'rtx5090'"),
        (
            ["--max-memory", "cpu=1KiB", "disk=1KiB"],
            "error: model.embed_tokens (",  # its size follows, then the reason
        ),
        (
            ["--max-memory", "cpu=1KiB", "disk=1KiB"],
            "fits on no device: every budget is full (cpu=1 KiB, disk=1 KiB). Raise a budget "
            "in max_memory, lower a reserve, or allow 'disk' without a limit.",
        ),
        (
            ["--max-memory", "cpu=1GiB", "--reserve", "0=1GiB"],
            "reserve names devices without a budget: 0",
        ),
    ]
    for extra, message in cases:
        code, out, err = cli("plan", str(demo_dir), *extra)
        assert code == 2, (extra, err)
        assert message in err, (extra, err)
        assert out == ""


def _mixed_dtype_demo(folder: Path) -> Path:
    """A one-file demo whose tensors are float32 except lm_head (float16); the config still
    declares float16, so sizing the meta model from the config undercounts about 2x."""
    from safetensors.torch import load_file, save_file

    make_demo(folder, arch="llama", params="500K", shards=1, seed=3)
    weights = folder / "model.safetensors"
    tensors = {
        name: tensor if name.startswith("lm_head") else tensor.float()
        for name, tensor in load_file(weights).items()
    }
    save_file(tensors, weights, metadata={"format": "pt"})
    return folder


def test_mixed_dtype_checkpoint_plans_the_bytes_the_tree_reports(cli, tmp_path: Path) -> None:
    demo = _mixed_dtype_demo(tmp_path / "mixed")
    opened = open_model(demo)
    assert opened.checkpoint.dtype_nbytes().keys() == {torch.float32, torch.float16}
    layer = opened.tree.node("model.layers.0").nbytes
    # fp32 layers: the tree counts 4 B per weight, the config dtype would say 2 B
    assert layer == 4 * opened.tree.node("model.layers.0").param_count
    budget = f"cpu={int(2.5 * layer) + _cpu_reserve(demo)}"  # two layers beside the reserve
    code, out, err = cli("plan", str(demo), "--max-memory", budget, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["dtype"] == "as stored"
    assert sum(data["per_device_bytes"].values()) == opened.tree.root.nbytes
    assert set(data["per_device_bytes"]) == {"cpu", "disk"}
    assert data["per_device_bytes"]["cpu"] <= 2.5 * layer
    assert opened.module_sizes() == opened.tree.module_sizes()
    halved = opened.module_sizes("float16")
    assert halved[""] == opened.with_dtype("float16").tree.root.nbytes < opened.tree.root.nbytes


def _emitted_max_memory(code_text: str) -> dict:
    """The literal ``max_memory = {...}`` the emitted ``from_pretrained`` call is given."""
    for node in ast.walk(ast.parse(code_text)):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "max_memory":
            return ast.literal_eval(node.value)
    raise AssertionError(f"no max_memory = in:\n{code_text}")


def test_emitted_budgets_parse_back_under_accelerates_rules(cli, demo_dir: Path) -> None:
    # 1000001 B has no exact unit; 1 TiB and 2 TB have units accelerate does not read
    budgets = {"cpu": 1000001, "disk": 2**40, 0: 2 * 10**12, 1: 3 * 2**30}
    items = [f"{device}={nbytes}" for device, nbytes in budgets.items()]
    code, out, err = cli("plan", str(demo_dir), "--max-memory", *items, "--emit-code", "--json")
    assert code == 0, err
    max_memory = _emitted_max_memory(json.loads(out)["code"])
    assert max_memory == {"cpu": 1000001, "disk": "1024GiB", 0: "2000GB", 1: "3GiB"}
    accelerate_utils = pytest.importorskip("accelerate.utils")
    parsed = {
        device: accelerate_utils.convert_file_size_to_int(value)
        for device, value in max_memory.items()
    }
    assert parsed == budgets


def test_emitted_code_runs_and_asks_for_the_exact_budgets(cli, demo_dir: Path) -> None:
    budgets = {"cpu": 1234567891, "disk": 2 * 10**12}
    items = [f"{device}={nbytes}" for device, nbytes in budgets.items()]
    code, out, err = cli("plan", str(demo_dir), "--max-memory", *items, "--emit-code", "--json")
    assert code == 0, err
    emitted = json.loads(out)["code"]
    namespace: dict = {}
    exec(emitted.split("\nmodel = ")[0], namespace)  # everything before from_pretrained runs
    assert namespace["max_memory"] == {"cpu": 1234567891, "disk": "2000GB"}
    accelerate_utils = pytest.importorskip("accelerate.utils")
    parsed = {
        d: accelerate_utils.convert_file_size_to_int(v) for d, v in namespace["max_memory"].items()
    }
    assert parsed == budgets


def test_a_model_without_a_memory_model_plans_without_the_default_reserve(
    cli, tmp_path: Path
) -> None:
    import transformers

    config = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1])
    config.save_pretrained(tmp_path)  # no decoder layers: nothing for the memory model to read
    code, out, err = cli("plan", str(tmp_path), "--max-memory", "cpu=1GiB", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["reserve"] == {} and data["memory"] is None  # as the planner panel plans it
    assert data["warnings"][0].startswith(f"no memory model for {tmp_path.name} (ResNetConfig")
    code, out, err = cli("plan", str(tmp_path), "--max-memory", "cpu=1GiB", "--context", "128")
    assert (code, out) == (2, "") and "ResNetConfig has no layer count" in err  # asked for one


def test_an_encoder_plan_predicts_one_forward_not_tokens_per_second(cli) -> None:
    code, out, _ = cli("plan", "bert-base-uncased", "--max-memory", "cpu=8GiB")
    assert code == 0
    (line,) = [text for text in out.splitlines() if text.startswith("predicted")]
    assert line.startswith("predicted  one forward over 128 tokens in ")
    assert "tok/s" not in line and "TTFT" not in line
    code, out, _ = cli("plan", "bert-base-uncased", "--max-memory", "cpu=8GiB", "--json")
    data = json.loads(out)
    assert data["generates_tokens"] is False
    speed = data["speed"]
    assert 0 < speed["prefill_s"] == speed["ttft_s"] and speed["prompt_tokens"] == 128
    code, out, _ = cli("plan", "gpt2", "--max-memory", "cpu=8GiB", "--json")
    assert json.loads(out)["generates_tokens"] is True
