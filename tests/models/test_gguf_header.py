"""GGUF intake: the header read with the gguf package's vocabulary, the model tree with the
file's own bytes beside the converted ones, planning from the header alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from real_model import real_gguf
from tiny_gguf import BLOCKS, FFN, HIDDEN, write_tiny_gguf

from workbench.models.errors import ModelSourceError
from workbench.models.gguf import read_gguf_header
from workbench.models.intake import open_model


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.Q8_0.gguf"
    write_tiny_gguf(path)
    return path


def test_header_gives_architecture_hyper_parameters_and_tensors(tiny_gguf) -> None:
    header = read_gguf_header(tiny_gguf)

    assert header.architecture == "llama"
    assert header.name == "tiny-llama"
    params = header.hyper_parameters()
    assert params["block_count"] == BLOCKS
    assert params["embedding_length"] == HIDDEN
    assert params["feed_forward_length"] == FFN
    assert header.array_lengths["tokenizer.ggml.tokens"] == 258
    assert header.fields["tokenizer.ggml.tokens"] == "<258 items>"  # kept as a count
    # 1 embedding + 7 matrices per block in Q8_0; 2 norms per block + the output norm in F32
    assert header.quant_types == {"Q8_0": 1 + 7 * BLOCKS, "F32": 2 * BLOCKS + 1}
    by_name = {t.name: t for t in header.tensors}
    k_proj = by_name["blk.0.attn_k.weight"]
    assert k_proj.shape == (32, 64)  # torch order: rows (kv heads * head dim) first
    assert k_proj.quant_type == "Q8_0"
    # Q8_0: blocks of 32 values in 34 bytes (32 int8 + an fp16 scale): 32*64/32 * 34 = 2176
    assert k_proj.stored_nbytes == 2176
    assert by_name["blk.0.attn_norm.weight"].stored_nbytes == 64 * 4  # F32
    assert by_name["token_embd.weight"].stored_nbytes == 258 * 64 // 32 * 34


def test_header_bytes_and_offsets_match_the_gguf_reader(tiny_gguf) -> None:
    import gguf

    header = read_gguf_header(tiny_gguf)
    reader = gguf.GGUFReader(tiny_gguf)
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    assert [t.stored_nbytes for t in header.tensors] == [int(t.n_bytes) for t in reader.tensors]
    assert [header.data_offset + t.offset for t in header.tensors] == [
        int(t.data_offset) for t in reader.tensors
    ]
    assert [t.quant_type for t in header.tensors] == [t.tensor_type.name for t in reader.tensors]


@pytest.mark.parametrize("quant", ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "F16"])
def test_each_quantization_type_counts_its_own_bytes(tmp_path, quant) -> None:
    import gguf

    path = tmp_path / f"tiny.{quant}.gguf"
    write_tiny_gguf(path, quant=quant)
    header = read_gguf_header(path)
    block, block_nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[quant]]
    q_proj = next(t for t in header.tensors if t.name == "blk.1.attn_q.weight")
    assert q_proj.quant_type == quant
    assert q_proj.stored_nbytes == 64 * 64 // block * block_nbytes
    reader = gguf.GGUFReader(path)
    assert header.stored_nbytes == sum(int(t.n_bytes) for t in reader.tensors)


def test_opened_gguf_tree_shows_file_bytes_beside_converted_bytes(tiny_gguf) -> None:
    opened = open_model(str(tiny_gguf))

    assert opened.gguf is not None and opened.checkpoint is None
    assert opened.model_class == "LlamaForCausalLM"
    assert opened.planning_dtype == torch.bfloat16
    assert opened.missing_keys == [] and opened.unexpected_keys == []
    assert opened.tied_weight_keys == ["lm_head.weight"]  # no output.weight: tied
    assert opened.label == "tiny-llama.Q8_0"
    q_proj = opened.tree.node("model.layers.0.self_attn.q_proj")
    assert q_proj.stored_nbytes == 64 * 64 // 32 * 34  # Q8_0 in the file: 4352
    assert q_proj.nbytes == 64 * 64 * 2  # bfloat16 once converted: 8192
    header = read_gguf_header(tiny_gguf)
    # every GGUF byte lands in the tree; the rest are the rotary buffers inv_freq and
    # original_inv_freq (16 fp32 each)
    assert opened.tree.root.stored_nbytes == header.stored_nbytes + 2 * 16 * 4
    as_fp32 = opened.with_dtype("float32")
    assert as_fp32.tree.node("model.layers.0.self_attn.q_proj").nbytes == 64 * 64 * 4
    assert as_fp32.tree.node("model.layers.0.self_attn.q_proj").stored_nbytes == 4352
    # "as stored" is not a torch size for a GGUF: it plans in the converted dtype
    assert opened.with_dtype(None).tree.root.nbytes == opened.tree.root.nbytes


def test_planning_works_from_the_header_alone(tiny_gguf) -> None:
    from workbench.big_modeling import infer_auto_device_map

    opened = open_model(str(tiny_gguf))
    sizes = opened.module_sizes()
    layer = sizes["model.layers.0"]
    device_map = infer_auto_device_map(
        opened.model,
        max_memory={"cpu": sizes[""] - layer, "disk": 10**9},
        no_split_module_classes=opened.no_split_modules,
        module_sizes=sizes,
    )
    assert "disk" in set(device_map.values())
    assert set(device_map.values()) <= {"cpu", "disk"}


def test_a_file_that_is_not_gguf_is_named(tmp_path) -> None:
    path = tmp_path / "weights.gguf"
    path.write_bytes(b"PK\x03\x04 not a gguf at all")
    with pytest.raises(ModelSourceError, match=r"weights\.gguf is not a GGUF file"):
        open_model(str(path))


def test_a_truncated_gguf_names_where_it_ends(tiny_gguf, tmp_path) -> None:
    data = tiny_gguf.read_bytes()
    header_cut = tmp_path / "header-cut.gguf"
    header_cut.write_bytes(data[:300])
    with pytest.raises(ModelSourceError, match=r"header-cut\.gguf is truncated: its GGUF header"):
        read_gguf_header(header_cut)
    data_cut = tmp_path / "data-cut.gguf"
    data_cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelSourceError, match=r"data-cut\.gguf is truncated: tensor"):
        read_gguf_header(data_cut)


def test_an_architecture_transformers_cannot_convert_is_named(tmp_path) -> None:
    path = tmp_path / "odd.gguf"
    write_tiny_gguf(path, arch="rwkv6")
    with pytest.raises(ModelSourceError) as caught:
        open_model(str(path))
    message = str(caught.value)
    assert "GGUF architecture 'rwkv6' cannot be converted" in message
    assert "llama" in message and "qwen2" in message  # what transformers supports


def test_cli_inspect_reads_a_gguf(tiny_gguf) -> None:
    import json
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "workbench", "inspect", str(tiny_gguf), "--json"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert "LlamaForCausalLM" in json.dumps(data)


@pytest.mark.slow  # reads the 98 MB real file's header (a 49,152-token vocabulary)
def test_the_real_gguf_header() -> None:
    header = read_gguf_header(real_gguf())

    assert header.architecture == "llama"
    assert header.hyper_parameters()["block_count"] == 30
    assert header.hyper_parameters()["embedding_length"] == 576
    assert header.array_lengths["tokenizer.ggml.tokens"] == 49152
    assert header.quant_types == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    embed = header.tensors[0]
    assert (embed.name, embed.shape, embed.quant_type) == (
        "token_embd.weight",
        (49152, 576),
        "Q8_0",
    )
    assert embed.stored_nbytes == 49152 * 576 // 32 * 34  # 30,081,024
    # Q4_1: blocks of 32 values in 20 bytes (16 B of nibbles + fp16 scale and min)
    ffn_down = next(t for t in header.tensors if t.name == "blk.0.ffn_down.weight")
    assert ffn_down.stored_nbytes == 576 * 1536 // 32 * 20
    assert header.data_offset + header.stored_nbytes <= header.file_nbytes


@pytest.mark.slow  # builds the 135M model on meta
def test_the_real_gguf_opens_as_smollm2() -> None:
    opened = open_model(str(real_gguf()))

    assert opened.model_class == "LlamaForCausalLM"
    assert opened.tree.root.param_count == 134_515_008
    assert opened.missing_keys == [] and opened.unexpected_keys == []
    # bf16, plus the rotary buffers inv_freq and original_inv_freq (32 floats each)
    assert opened.tree.root.nbytes == 134_515_008 * 2 + 2 * 32 * 2
    header = read_gguf_header(real_gguf())
    assert opened.tree.root.stored_nbytes == header.stored_nbytes + 2 * 32 * 4


def test_a_missing_gguf_is_named(tmp_path) -> None:
    missing = tmp_path / "nowhere.gguf"
    with pytest.raises(ModelSourceError, match=r"cannot read .*nowhere\.gguf"):
        open_model(str(missing))
