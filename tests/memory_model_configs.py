"""Tiny transformers configs of each attention kind, shared by the memory-model tests
(``tests/big_modeling/test_memory_model.py``) and ``benchmarks/bench_memory_model.py``."""

from __future__ import annotations

import transformers

VOCAB = 100
SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "vocab_size": VOCAB,
    "num_attention_heads": 4,
}


def tiny_configs(sliding_window: int = 5) -> dict[str, tuple[object, type]]:
    """One tiny config and its model class per attention kind, by case name."""
    tf = transformers
    return {
        "llama-gqa": (
            tf.LlamaConfig(**SMALL, num_hidden_layers=2, num_key_value_heads=2),
            tf.LlamaForCausalLM,
        ),
        "llama-mha": (
            tf.LlamaConfig(**SMALL, num_hidden_layers=2, num_key_value_heads=4),
            tf.LlamaForCausalLM,
        ),
        "gpt2-mha": (
            tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB),
            tf.GPT2LMHeadModel,
        ),
        "bigcode-mqa": (
            tf.GPTBigCodeConfig(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, multi_query=True),
            tf.GPTBigCodeForCausalLM,
        ),
        "mistral-sliding": (
            tf.MistralConfig(
                **SMALL, num_hidden_layers=2, num_key_value_heads=2, sliding_window=sliding_window
            ),
            tf.MistralForCausalLM,
        ),
        "qwen2-sliding": (
            tf.Qwen2Config(
                **SMALL,
                num_hidden_layers=2,
                num_key_value_heads=2,
                sliding_window=sliding_window,
                use_sliding_window=True,
                max_window_layers=1,
            ),
            tf.Qwen2ForCausalLM,
        ),
        "gemma2-layer-types": (
            tf.Gemma2Config(
                **SMALL,
                num_hidden_layers=4,
                num_key_value_heads=2,
                head_dim=16,
                sliding_window=sliding_window,
            ),
            tf.Gemma2ForCausalLM,
        ),
        "gemma3-pattern": (
            tf.Gemma3TextConfig(
                **SMALL,
                num_hidden_layers=4,
                num_key_value_heads=2,
                head_dim=16,
                sliding_window=sliding_window,
                sliding_window_pattern=2,
            ),
            tf.Gemma3ForCausalLM,
        ),
        "deepseek-v3-mla-moe": (
            tf.DeepseekV3Config(
                **SMALL,
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
        "mamba": (
            tf.MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=VOCAB, state_size=8),
            tf.MambaForCausalLM,
        ),
        "mamba2": (
            tf.Mamba2Config(
                hidden_size=64,
                num_hidden_layers=2,
                vocab_size=VOCAB,
                state_size=8,
                num_heads=8,
                head_dim=16,
                n_groups=1,
            ),
            tf.Mamba2ForCausalLM,
        ),
        "bamba-hybrid": (
            tf.BambaConfig(
                **SMALL,
                num_hidden_layers=4,
                num_key_value_heads=2,
                attn_layer_indices=[1],
                mamba_n_heads=8,
                mamba_d_head=16,
                mamba_d_state=8,
                mamba_n_groups=1,
                mamba_expand=2,
            ),
            tf.BambaForCausalLM,
        ),
        "jamba-hybrid-moe": (
            tf.JambaConfig(
                **SMALL,
                num_hidden_layers=4,
                num_key_value_heads=2,
                attn_layer_period=2,
                attn_layer_offset=1,
                expert_layer_period=2,
                expert_layer_offset=1,
                num_experts=4,
                mamba_d_state=8,
                mamba_expand=2,
                use_mamba_kernels=False,
            ),
            tf.JambaForCausalLM,
        ),
        "t5-cross": (
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
        "bart-cross": (
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
