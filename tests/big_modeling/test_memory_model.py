"""The memory model by attention kind, checked against the caches transformers really allocates.

Each case builds a tiny config (hidden 64, 2-4 layers, vocab 100), instantiates the model with
random weights on CPU, runs a real forward with ``use_cache=True`` over a prompt longer than any
sliding window, and compares the bytes of every tensor in the returned cache, per layer, with
``kv_cache_per_layer``: exactly.
"""

from __future__ import annotations

import gc
import warnings

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

transformers = pytest.importorskip("transformers")

from chunk_measure import second_chunk_activation  # noqa: E402  (tests/, shared)
from memory_model_configs import SMALL, VOCAB, tiny_configs  # noqa: E402  (tests/, shared)

from workbench.big_modeling.empty_init import init_empty_weights  # noqa: E402
from workbench.big_modeling.errors import BadInputError  # noqa: E402
from workbench.big_modeling.planning.activation_peak import (  # noqa: E402
    activation_peak,
    forward_peak_terms,
)
from workbench.big_modeling.planning.attention_kinds import (  # noqa: E402
    AttentionKindWarning,
    read_attention_layout,
)
from workbench.big_modeling.planning.device_reserve import (  # noqa: E402
    layer_devices_from_map,
    reserve_per_device,
)
from workbench.big_modeling.planning.kv_cache import (  # noqa: E402
    default_context,
    kv_cache_per_layer,
    layout_of,
    measured_cache_nbytes,
)
from workbench.big_modeling.planning.sizes import compute_module_sizes  # noqa: E402

PROMPT = 12  # tokens; every sliding window below is 5
CASES = sorted(tiny_configs())
DECODER_TOKENS = 3  # encoder-decoder cases: PROMPT encoder tokens, 3 decoder tokens


def _forward(config: object, model_class: type, **kwargs: object) -> object:
    torch.manual_seed(0)
    model = model_class(config).eval()
    ids = torch.randint(0, VOCAB, (1, PROMPT))
    if getattr(config, "is_encoder_decoder", False):
        kwargs.setdefault("decoder_input_ids", torch.zeros(1, DECODER_TOKENS, dtype=torch.long))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model(input_ids=ids, use_cache=True, **kwargs)
    return out.past_key_values


@pytest.mark.parametrize("case", CASES)
def test_dynamic_cache_bytes_match_exactly(case: str) -> None:
    config, model_class = tiny_configs()[case]
    cache = _forward(config, model_class)
    encoder_decoder = getattr(config, "is_encoder_decoder", False)
    predicted = kv_cache_per_layer(
        config,
        batch=1,
        context=DECODER_TOKENS if encoder_decoder else PROMPT,
        encoder_context=PROMPT if encoder_decoder else None,
        model_dtype=torch.float32,
        cache="dynamic",
    )
    assert [layer.nbytes for layer in predicted] == measured_cache_nbytes(cache)


@pytest.mark.parametrize("case", ["llama-gqa", "gemma2-layer-types", "mistral-sliding"])
def test_static_cache_bytes_match_exactly(case: str) -> None:
    config, model_class = tiny_configs()[case]
    cache = transformers.StaticCache(config=config, max_cache_len=20)
    _forward(config, model_class, past_key_values=cache)
    predicted = kv_cache_per_layer(config, batch=1, context=20, model_dtype=torch.float32)
    assert [layer.nbytes for layer in predicted] == measured_cache_nbytes(cache)


def test_an_encoder_keeps_no_cache_and_its_causal_head_keeps_one() -> None:
    # BertForMaskedLM attends over the whole input in one forward: transformers returns no
    # cache, and the memory model predicts none; BertLMHeadModel (is_decoder) caches K/V
    small = {**SMALL, "num_hidden_layers": 2}
    encoder = transformers.BertConfig(**small, architectures=["BertForMaskedLM"])
    torch.manual_seed(0)
    with torch.no_grad():
        out = transformers.BertForMaskedLM(encoder).eval()(
            input_ids=torch.randint(0, VOCAB, (1, PROMPT))
        )
    assert getattr(out, "past_key_values", None) is None
    predicted = kv_cache_per_layer(encoder, batch=1, context=PROMPT, model_dtype=torch.float32)
    assert [layer.nbytes for layer in predicted] == [0, 0]
    reserve = reserve_per_device(encoder, {"": "cpu"}, batch=1, context=PROMPT)
    assert reserve["cpu"].kv_nbytes == 0 and "keep no KV cache (an encoder" in reserve["cpu"].why

    decoder = transformers.BertConfig(**small, is_decoder=True, architectures=["BertLMHeadModel"])
    cache = _forward(decoder, transformers.BertLMHeadModel)
    predicted = kv_cache_per_layer(
        decoder, batch=1, context=PROMPT, model_dtype=torch.float32, cache="dynamic"
    )
    assert [layer.nbytes for layer in predicted] == measured_cache_nbytes(cache)
    assert all(layer.nbytes > 0 for layer in predicted)


def test_bf16_model_and_batch_match_exactly() -> None:
    config, model_class = tiny_configs()["gemma2-layer-types"]
    torch.manual_seed(0)
    model = model_class(config).to(torch.bfloat16).eval()
    with torch.no_grad():
        cache = model(
            input_ids=torch.randint(0, VOCAB, (3, PROMPT)), use_cache=True
        ).past_key_values
    predicted = kv_cache_per_layer(
        config, batch=3, context=PROMPT, model_dtype="bf16", cache="dynamic"
    )
    assert [layer.nbytes for layer in predicted] == measured_cache_nbytes(cache)


def test_kinds_read_from_each_config() -> None:
    kinds = {
        case: [layer.label for layer in read_attention_layout(config).layers]
        for case, (config, _) in tiny_configs().items()
    }
    assert kinds["llama-gqa"] == ["GQA 2 of 4 heads"] * 2
    assert kinds["llama-mha"] == ["MHA 4 of 4 heads"] * 2
    assert kinds["bigcode-mqa"] == ["MQA 1 of 4 heads"] * 2
    assert kinds["qwen2-sliding"] == ["GQA 2 of 4 heads", "sliding window 5, GQA 2 of 4 heads"]
    assert kinds["gemma3-pattern"][:2] == ["sliding window 5, GQA 2 of 4 heads", "GQA 2 of 4 heads"]
    assert kinds["deepseek-v3-mla-moe"] == ["MLA latent 16 + rope 8", "MLA latent 16 + rope 8, MoE"]
    assert kinds["bamba-hybrid"] == [
        "mamba2 state",
        "GQA 2 of 4 heads",
        "mamba2 state",
        "mamba2 state",
    ]
    assert kinds["jamba-hybrid-moe"][:2] == ["mamba state", "GQA 2 of 4 heads, MoE"]
    assert kinds["t5-cross"] == ["MHA 4 of 4 heads, cross-attention"] * 2


def test_mla_engines_latent_against_expanded() -> None:
    config, _ = tiny_configs()["deepseek-v3-mla-moe"]
    # latent: 1 x 10 tokens x (16 + 8) x 2 B; expanded: 1 x 10 x 4 heads x (16 + 8 + 16) x 2 B
    for engine in ("transformers", "vllm", "sglang"):
        assert kv_cache_per_layer(config, batch=1, context=10, engine=engine)[0].nbytes == 480
    assert (
        kv_cache_per_layer(config, batch=1, context=10, engine="transformers-4")[0].nbytes == 3200
    )
    with pytest.raises(BadInputError, match="engine"):
        kv_cache_per_layer(config, batch=1, context=10, engine="tgi")  # type: ignore[arg-type]


def test_kv_dtype_scales_attention_not_state() -> None:
    config, _ = tiny_configs()["bamba-hybrid"]
    fp16 = kv_cache_per_layer(config, batch=1, context=64, kv_dtype="fp16", model_dtype="bf16")
    fp8 = kv_cache_per_layer(config, batch=1, context=64, kv_dtype="fp8", model_dtype="bf16")
    assert fp8[1].self_nbytes * 2 == fp16[1].self_nbytes
    assert fp8[0].state_nbytes == fp16[0].state_nbytes > 0


def test_unknown_layer_type_falls_back_to_dense_with_warning() -> None:
    config = transformers.LlamaConfig(**SMALL, num_hidden_layers=2, num_key_value_heads=2)
    config.layer_types = ["full_attention", "ring_attention"]
    with pytest.warns(AttentionKindWarning, match=r"layer_types\[1\]='ring_attention'"):
        layout = read_attention_layout(config)
    assert layout.layers[1].kind == "full"
    assert "ring_attention" in layout.warnings[0]


def test_unused_variant_key_is_named() -> None:
    config = transformers.LlamaConfig(**SMALL, num_hidden_layers=2)
    config.attention_window = 256
    with pytest.warns(AttentionKindWarning, match="attention_window=256"):
        read_attention_layout(config)


def test_default_context_caps_the_model_maximum() -> None:
    gpt2, _ = tiny_configs()["gpt2-mha"]
    mistral, _ = tiny_configs()["mistral-sliding"]
    t5, _ = tiny_configs()["t5-cross"]
    assert default_context(gpt2) == 1024
    assert default_context(mistral) == 32768
    assert default_context(mistral, context_cap=8192) == 8192
    assert default_context(t5, context_cap=2048) == 2048


def _profiled_peak(model: torch.nn.Module, **inputs: object) -> tuple[int, object]:
    """Peak CPU bytes allocated during one forward (torch.profiler memory events), and output.

    Garbage is collected first, so that no earlier test's tensors are freed in the window.
    """
    gc.collect()
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = model(**inputs)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    current = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        current += event.nbytes()
        peak = max(peak, current)
    return peak, out


@pytest.mark.parametrize("case", ["llama-gqa", "gpt2-mha", "qwen2-sliding", "deepseek-v3-mla-moe"])
def test_eager_prefill_activation_peak_within_10_percent(case: str) -> None:
    config, model_class = tiny_configs()[case]
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = model_class(config).eval()
    tokens = 256
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peak, out = _profiled_peak(
            model, input_ids=torch.randint(0, VOCAB, (1, tokens)), use_cache=True, logits_to_keep=1
        )
    measured = peak - sum(measured_cache_nbytes(out.past_key_values))
    predicted = activation_peak(
        config, batch=1, tokens=tokens, dtype=torch.float32, attention="eager"
    ).prefill_nbytes
    assert abs(predicted - measured) <= 0.10 * measured


def _measured_prefill_and_decode(
    config: object, model_class: type, tokens: int
) -> tuple[int, int, int]:
    """Activation of a real prefill and of the second decode step, and ``logits_to_keep``.

    Each is the profiler's peak minus the cache the forward added. The second step is
    measured: the first also frees the whole prompt's K/V storage sliding layers keep a view
    of; it runs under the profiler too, which reports a release only if it saw the allocation.
    """
    torch.manual_seed(0)
    model = model_class(config).eval()
    encoder_decoder = getattr(config, "is_encoder_decoder", False)
    inputs: dict[str, object] = {"input_ids": torch.randint(0, VOCAB, (1, tokens))}
    if encoder_decoder:
        inputs["decoder_input_ids"] = torch.zeros(1, tokens, dtype=torch.long)
    else:
        inputs["logits_to_keep"] = 1
    peak, out = _profiled_peak(model, use_cache=True, **inputs)
    cache = out.past_key_values
    prefill = peak - sum(measured_cache_nbytes(cache))

    def step() -> dict[str, object]:
        token = torch.randint(0, VOCAB, (1, 1))
        if encoder_decoder:
            return {
                "decoder_input_ids": token,
                "encoder_outputs": (out.encoder_last_hidden_state,),
            }
        return {"input_ids": token}

    _profiled_peak(model, cache=cache, use_cache=True, **step())
    before = sum(measured_cache_nbytes(cache))
    peak, _ = _profiled_peak(model, cache=cache, use_cache=True, **step())
    decode = peak - (sum(measured_cache_nbytes(cache)) - before)
    return prefill, decode, 0 if encoder_decoder else 1


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("case", CASES)
def test_prefill_and_decode_activation_within_10_percent(case: str, attention: str) -> None:
    config, model_class = tiny_configs()[case]
    config._attn_implementation = attention
    try:
        model_class(config)
    except ValueError as error:  # the model does not take this implementation
        pytest.skip(str(error)[:80])
    tokens = 256
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prefill, decode, keep = _measured_prefill_and_decode(config, model_class, tokens)
    predicted = activation_peak(
        config,
        batch=1,
        tokens=tokens,
        context=tokens + 2,  # the measured step runs with the prompt and one token cached
        dtype=torch.float32,
        attention=attention,  # type: ignore[arg-type]
        logits_to_keep=keep,
        cpu_threads=torch.get_num_threads(),
    )
    assert abs(predicted.prefill_nbytes - prefill) <= 0.10 * prefill, (predicted, prefill)
    assert abs(predicted.decode_nbytes - decode) <= 0.10 * decode, (predicted, decode)


def test_reserve_per_device_splits_kv_by_layer_placement() -> None:
    config = transformers.LlamaConfig(
        num_hidden_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        vocab_size=128256,
        max_position_embeddings=131072,
    )
    reserve = reserve_per_device(
        config, ["cuda:0"] * 32, batch=1, context=8192, kv_dtype="fp16", model_dtype="bf16"
    )
    # 32 layers x 1 x 8192 tokens x 8 kv heads x (128 + 128) x 2 B = 1 GiB
    assert reserve["cuda:0"].kv_nbytes == 2**30
    assert reserve["cuda:0"].why.startswith(
        "layers 0-31 on cuda:0 need 1 GiB of KV cache at 8k context, fp16, GQA 8 of 32 heads"
    )
    split = reserve_per_device(
        config, ["cuda:0"] * 20 + ["cuda:1"] * 12, batch=2, context=8192, kv_dtype="fp8"
    )
    assert split["cuda:0"].kv_nbytes == 20 * 2 * 8192 * 8 * 256
    assert split["cuda:1"].kv_nbytes == 12 * 2 * 8192 * 8 * 256
    # the logits (one position per sequence) are charged to the device of the last layer only
    assert split["cuda:1"].activation_nbytes >= split["cuda:0"].activation_nbytes
    assert split["cuda:1"].why.startswith("layers 20-31 on cuda:1")


def test_reserve_from_device_map_and_offloaded_layers() -> None:
    config, _ = tiny_configs()["gemma2-layer-types"]
    device_map = {
        "model.embed_tokens": 0,
        "model.layers.0": 0,
        "model.layers.1": 0,
        "model.layers.2.self_attn": 1,
        "model.layers.2.mlp": 1,
        "model.layers.3": "disk",
        "model.norm": 1,
        "lm_head": 1,
    }
    reserve = reserve_per_device(config, device_map, context=64, model_dtype="fp16")
    layers = kv_cache_per_layer(config, batch=1, context=64)
    assert {device: r.layers for device, r in reserve.items()} == {
        "cuda:0": (0, 1),
        "cuda:1": (2,),
        "disk": (3,),
    }
    assert reserve["cuda:1"].kv_nbytes == layers[2].nbytes
    offloaded = reserve_per_device(
        config, device_map, context=64, model_dtype="fp16", offload_execution_device=0
    )
    assert offloaded["cuda:0"].layers == (0, 1, 3)
    assert "layers 0-1, 3 on cuda:0" in offloaded["cuda:0"].why


def test_layer_devices_from_maps() -> None:
    assert layer_devices_from_map({"": "cuda:0"}, 3) == ["cuda:0"] * 3
    assert layer_devices_from_map({"model": 0, "lm_head": 1}, 2) == ["cuda:0", "cuda:0"]
    t5_map = {"shared": 0, "encoder": 0, "decoder.block.0": 0, "decoder.block.1": 1, "lm_head": 1}
    assert layer_devices_from_map(t5_map, 2) == ["cuda:0", "cuda:1"]
    with pytest.raises(BadInputError, match="decoder layer 1"):
        layer_devices_from_map({"model.layers.0": 0, "lm_head": 0}, 2)
    config, _ = tiny_configs()["llama-gqa"]
    with pytest.raises(BadInputError, match="3 layer devices for 2"):
        reserve_per_device(config, [0, 0, 1], context=8)


def test_state_layer_without_state_size_counts_as_dense() -> None:
    config = transformers.LlamaConfig(**SMALL, num_hidden_layers=2, num_key_value_heads=2)
    config.layer_types = ["linear_attention", "full_attention"]
    with pytest.warns(AttentionKindWarning, match="without a state size"):
        layers = kv_cache_per_layer(config, batch=1, context=8, kv_dtype="fp16")
    assert layers[0].nbytes == layers[1].nbytes == 1 * 8 * 2 * (16 + 16) * 2


@pytest.mark.parametrize(("case", "attention"), [("mamba2", "eager"), ("bamba-hybrid", "sdpa")])
def test_chunked_scan_total_within_5_percent(case: str, attention: str) -> None:
    """Weights + KV + prefill activation of a Mamba 2 scan against weights + the real peak.

    300 tokens pad to two 256-token chunks, and a batch of 2: the scan's float32 locals
    (scores, decays, the padded inputs and every output stage) dominate the peak.
    """
    config, model_class = tiny_configs()[case]
    config._attn_implementation = attention
    torch.manual_seed(0)
    model = model_class(config).eval()
    batch, tokens = 2, 300
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peak, _ = _profiled_peak(
            model,
            input_ids=torch.randint(0, VOCAB, (batch, tokens)),
            use_cache=True,
            logits_to_keep=1,
        )
    with init_empty_weights():
        weights = compute_module_sizes(model_class(config))[""]
    kv = kv_cache_per_layer(
        config, batch=batch, context=tokens, model_dtype=torch.float32, cache="dynamic"
    )
    activation = activation_peak(
        config,
        batch=batch,
        tokens=tokens,
        dtype=torch.float32,
        attention=attention,  # type: ignore[arg-type]
        cpu_threads=torch.get_num_threads(),
    )
    predicted = weights + sum(layer.nbytes for layer in kv) + activation.prefill_nbytes
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}  # tied ones once
    measured = sum(t.nbytes for t in tensors.values()) + peak
    assert abs(predicted - measured) <= 0.05 * measured, (predicted, measured)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("case", ["mistral-sliding", "qwen2-sliding", "llama-gqa", "gpt2-mha"])
def test_a_second_prefill_chunk_within_10_percent(case: str, attention: str) -> None:
    """A 128-token chunk after 128 cached tokens: sdpa gets a mask (is_causal cannot place the
    queries after the cache), GQA repeats K/V, and each sliding layer keeps the storage of the
    whole concatenation behind its window view (128 + 4 tokens here, the view 4). Before these
    terms the chunk was predicted 16% (Mistral sdpa) and 26% (Qwen2 sdpa) low; measured with a
    profiler started after the first chunk (which misses the old cache's frees), Llama and
    GPT-2 sdpa read 11-15% low (``chunk_measure``)."""
    config, model_class = tiny_configs()[case]
    config._attn_implementation = attention
    torch.manual_seed(0)
    model = model_class(config).eval()
    chunk = 128
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = second_chunk_activation(model, 1, chunk)
    predicted = forward_peak_terms(
        layout_of(config),
        batch=1,
        tokens=chunk,
        past=chunk,
        nbytes=4,
        attention=attention,
        logits_to_keep=1,
        cpu_threads=torch.get_num_threads(),
    )["peak"]
    assert abs(predicted - measured) <= 0.10 * measured, (predicted, measured)
