"""Memory model against real transformers forwards on CPU, one tiny config per attention kind.

For each kind (MHA, GQA, MQA, sliding window, Gemma 2 layer types, MLA + MoE, Mamba, Mamba 2,
Bamba and Jamba hybrids, T5 and Bart cross-attention) and each attention implementation the
model accepts (eager, sdpa), the benchmark builds the model with random float32 weights, runs
a prefill of ``--tokens`` tokens with ``use_cache=True`` (``logits_to_keep=1`` where the model
takes it, as ``generate`` does) and then one decode step, and compares:

- weights: ``compute_module_sizes`` of the model built under ``init_empty_weights`` against the
  bytes of the real model's tensors;
- KV cache: ``kv_cache_per_layer(cache="dynamic")`` against the bytes of the returned cache;
- activation peak: ``activation_peak`` against the CPU allocator's peak during the forward
  (``torch.profiler`` memory events) minus the cache it returned;
- total: weights + KV + activation against weights + the measured peak;
- decode activation: ``decode_nbytes`` against the peak of one more token's forward minus what
  the cache grew by.

Targets (issue 21): KV exact; activation peak within 10%; total within 5%.

    python benchmarks/bench_memory_model.py [--tokens 512] [--batch 1]
"""

from __future__ import annotations

import argparse
import warnings

import torch
import transformers as tf
from torch.profiler import ProfilerActivity, profile

from workbench.big_modeling.empty_init import init_empty_weights
from workbench.big_modeling.planning.activation_peak import activation_peak
from workbench.big_modeling.planning.kv_cache import kv_cache_per_layer, measured_cache_nbytes
from workbench.big_modeling.planning.sizes import compute_module_sizes

VOCAB = 100
_SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "vocab_size": VOCAB,
    "num_attention_heads": 4,
}
_MAMBA = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": VOCAB, "state_size": 8}


def cases() -> dict[str, tuple[object, type]]:
    """One tiny config per attention kind, with its model class."""
    return {
        "MHA (gpt2)": (
            tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB),
            tf.GPT2LMHeadModel,
        ),
        "GQA (llama)": (
            tf.LlamaConfig(**_SMALL, num_hidden_layers=2, num_key_value_heads=2),
            tf.LlamaForCausalLM,
        ),
        "MQA (bigcode)": (
            tf.GPTBigCodeConfig(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, multi_query=True),
            tf.GPTBigCodeForCausalLM,
        ),
        "sliding (mistral)": (
            tf.MistralConfig(
                **_SMALL, num_hidden_layers=2, num_key_value_heads=2, sliding_window=64
            ),
            tf.MistralForCausalLM,
        ),
        "layer types (gemma2)": (
            tf.Gemma2Config(
                **_SMALL, num_hidden_layers=4, num_key_value_heads=2, head_dim=16, sliding_window=64
            ),
            tf.Gemma2ForCausalLM,
        ),
        "MLA + MoE (deepseek v3)": (
            tf.DeepseekV3Config(
                **_SMALL,
                num_hidden_layers=2,
                num_key_value_heads=4,
                kv_lora_rank=16,
                q_lora_rank=32,
                qk_rope_head_dim=8,
                qk_nope_head_dim=16,
                v_head_dim=16,
                n_routed_experts=4,
                num_experts_per_tok=2,
                first_k_dense_replace=1,
                moe_intermediate_size=32,
                n_group=1,
                topk_group=1,
            ),
            tf.DeepseekV3ForCausalLM,
        ),
        "state space (mamba)": (tf.MambaConfig(**_MAMBA), tf.MambaForCausalLM),
        "state space (mamba2)": (
            tf.Mamba2Config(**_MAMBA, num_heads=8, head_dim=16, n_groups=1),
            tf.Mamba2ForCausalLM,
        ),
        "hybrid (bamba)": (
            tf.BambaConfig(
                **_SMALL,
                num_hidden_layers=4,
                num_key_value_heads=2,
                attn_layer_indices=[1],
                mamba_n_heads=8,
                mamba_d_head=16,
                mamba_d_state=8,
                mamba_n_groups=1,
            ),
            tf.BambaForCausalLM,
        ),
        "hybrid + MoE (jamba)": (
            tf.JambaConfig(
                **_SMALL,
                num_hidden_layers=4,
                num_key_value_heads=2,
                attn_layer_period=2,
                attn_layer_offset=1,
                expert_layer_period=2,
                expert_layer_offset=1,
                num_experts=4,
                mamba_d_state=8,
                use_mamba_kernels=False,
            ),
            tf.JambaForCausalLM,
        ),
        "cross (t5)": (
            tf.T5Config(
                d_model=64,
                d_kv=16,
                d_ff=128,
                num_layers=2,
                num_decoder_layers=2,
                num_heads=4,
                vocab_size=VOCAB,
            ),
            tf.T5ForConditionalGeneration,
        ),
        "cross (bart)": (
            tf.BartConfig(
                d_model=64,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=128,
                decoder_ffn_dim=128,
                vocab_size=VOCAB,
            ),
            tf.BartForConditionalGeneration,
        ),
    }


def profiled_peak(model: torch.nn.Module, **inputs: object) -> tuple[int, object]:
    """Peak CPU bytes allocated during one forward (profiler memory events), and the output."""
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = model(**inputs)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    current = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        current += event.nbytes()
        peak = max(peak, current)
    return peak, out


def _error(predicted: int, measured: int) -> str:
    return "exact" if predicted == measured else f"{100 * (predicted - measured) / measured:+.1f}%"


def run_case(
    name: str, config: object, model_class: type, impl: str, batch: int, tokens: int
) -> str | None:
    """One table row, or ``None`` when the model does not take this attention implementation."""
    config._attn_implementation = impl
    try:
        torch.manual_seed(0)
        model = model_class(config).eval()
    except ValueError:
        return None
    with init_empty_weights():
        empty = model_class(config)
    predicted_weights = compute_module_sizes(empty)[""]
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    measured_weights = sum(t.nbytes for t in tensors.values())
    encoder_decoder = getattr(config, "is_encoder_decoder", False)
    inputs: dict[str, object] = {
        "input_ids": torch.randint(0, VOCAB, (batch, tokens)),
        "use_cache": True,
    }
    decoder_tokens = tokens
    if encoder_decoder:
        inputs["decoder_input_ids"] = torch.zeros(batch, decoder_tokens, dtype=torch.long)
    else:
        inputs["logits_to_keep"] = 1
    try:
        peak, out = profiled_peak(model, **inputs)
    except TypeError:
        inputs.pop("logits_to_keep")
        peak, out = profiled_peak(model, **inputs)
    cache = out.past_key_values
    measured_kv = sum(measured_cache_nbytes(cache))
    predicted_kv = sum(
        layer.nbytes
        for layer in kv_cache_per_layer(
            config,
            batch=batch,
            context=decoder_tokens,
            encoder_context=tokens if encoder_decoder else None,
            model_dtype=torch.float32,
            cache="dynamic",
        )
    )
    peak_model = activation_peak(
        config,
        batch=batch,
        tokens=tokens,
        dtype=torch.float32,
        attention="eager" if impl == "eager" else "sdpa",
        logits_to_keep=1 if "logits_to_keep" in inputs else 0,
    )
    measured_act = peak - measured_kv
    decode_inputs: dict[str, object] = {"cache": cache, "use_cache": True}
    step = torch.randint(0, VOCAB, (batch, 1))
    if encoder_decoder:
        decode_inputs["encoder_outputs"] = (out.encoder_last_hidden_state,)
        decode_inputs["decoder_input_ids"] = step
    else:
        decode_inputs["input_ids"] = step
    decode_peak, _ = profiled_peak(model, **decode_inputs)
    grown = sum(measured_cache_nbytes(cache)) - measured_kv
    measured_decode = decode_peak - grown
    predicted_total = predicted_weights + predicted_kv + peak_model.prefill_nbytes
    measured_total = measured_weights + peak
    return (
        f"| {name} | {impl} | {predicted_weights} / {measured_weights} "
        f"({_error(predicted_weights, measured_weights)}) | {predicted_kv} / {measured_kv} "
        f"({_error(predicted_kv, measured_kv)}) | {peak_model.prefill_nbytes} / {measured_act} "
        f"({_error(peak_model.prefill_nbytes, measured_act)}) | "
        f"{_error(predicted_total, measured_total)} | {peak_model.decode_nbytes} / "
        f"{measured_decode} ({_error(peak_model.decode_nbytes, measured_decode)}) |"
    )


def main() -> None:
    """Print the table (markdown) of predicted / measured bytes and errors."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    tf.logging.set_verbosity_error()
    print(
        f"prefill of {args.tokens} tokens, batch {args.batch}, float32, CPU, transformers {tf.__version__}"
    )
    print(
        "| kind | attention | weights pred / meas | KV pred / meas | activation pred / meas | total "
        "| decode activation pred / meas |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, (config, model_class) in cases().items():
        for impl in ("eager", "sdpa"):
            row = run_case(name, config, model_class, impl, args.batch, args.tokens)
            if row is not None:
                print(row, flush=True)


if __name__ == "__main__":
    main()
