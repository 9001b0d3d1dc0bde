"""A tiny Llama GGUF written with the ``gguf`` package's own writer, for tests that need a real
GGUF file but not a real model: 2 blocks of width 64, a 258-token byte-level BPE vocabulary,
matrices in Q8_0 (or another ggml type), norms in F32, embeddings tied (no ``output.weight``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN = 64
HEADS = 2
KV_HEADS = 1
HEAD_DIM = HIDDEN // HEADS  # 32
FFN = 128
BLOCKS = 2


def byte_tokens() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (``bytes_to_unicode``), in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tensor_shapes(vocab: int) -> dict[str, tuple[int, ...]]:
    """GGUF tensor names to torch-order shapes."""
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (vocab, HIDDEN)}
    for block in range(BLOCKS):
        prefix = f"blk.{block}."
        shapes |= {
            prefix + "attn_norm.weight": (HIDDEN,),
            prefix + "attn_q.weight": (HIDDEN, HIDDEN),
            prefix + "attn_k.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            prefix + "attn_v.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            prefix + "attn_output.weight": (HIDDEN, HIDDEN),
            prefix + "ffn_norm.weight": (HIDDEN,),
            prefix + "ffn_gate.weight": (FFN, HIDDEN),
            prefix + "ffn_up.weight": (FFN, HIDDEN),
            prefix + "ffn_down.weight": (HIDDEN, FFN),
        }
    shapes["output_norm.weight"] = (HIDDEN,)
    return shapes


def write_tiny_gguf(
    path: Path,
    *,
    arch: str = "llama",
    quant: str = "Q8_0",
    seed: int = 0,
    block_count: int = BLOCKS,
) -> dict[str, np.ndarray]:
    """Write the tiny GGUF to ``path``; return the float32 weights before quantization.

    ``block_count`` is what the header claims; the file always holds ``BLOCKS`` blocks."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens = [*byte_tokens(), "Ġt", "Ġth"]
    merges = ["Ġ t", "Ġt h"]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny-llama")
    writer.add_block_count(block_count)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(257)
    weights = {}
    qtype = gguf.GGMLQuantizationType[quant]
    for name, shape in tensor_shapes(len(tokens)).items():
        values = rng.standard_normal(shape).astype(np.float32) * 0.05
        if len(shape) == 1:
            values = np.ones(shape, np.float32) + values
            writer.add_tensor(name, values)
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        weights[name] = values
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights
