"""A model as the cluster planner sees it: repeated blocks, what comes before and after them,
and the per-token shapes that size the KV cache and the traffic between devices.

``ModelLayout.from_opened`` reads everything from the opened model's tree (the bytes the
single-machine planner uses) and its config: the *layers* are the outermost no-split blocks
(``model.layers.N``); tensors met before the first layer (``model.embed_tokens``) go with the
first pipeline stage, tensors after the last (``model.norm``, ``lm_head``) with the last stage.
A tied ``lm_head`` costs the last stage a copy of the embedding when the pipeline has more than
one stage, as vLLM and SGLang load it there.

The KV cache comes from the memory model (``kv_cache_per_layer``) counted as the serving engine
keeps it: GQA/MQA heads split over tensor-parallel ranks, sliding layers hold their window, and
an MLA model (DeepSeek-V2/V3) keeps the compressed latent, ``kv_lora_rank + qk_rope_head_dim``
per token, whole on every TP rank (vLLM and SGLang replicate it; it has no heads to split).
A mixture-of-experts layer holds all its experts but a token reads and computes only
``experts_per_token`` of them (``read_nbytes``, ``active_params``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.planning.activation_peak import activation_peak
from workbench.big_modeling.planning.attention_kinds import AttentionLayout, read_attention_layout
from workbench.big_modeling.planning.kv_cache import kv_cache_per_layer

if TYPE_CHECKING:
    from workbench.models.intake import OpenedModel

# Whose cache layout each cluster engine has (kv_cache_per_layer's engines); llama.cpp and our
# own torch pipeline (transformers) keep the MLA latent too.
KV_ENGINES = {
    "vllm": "vllm",
    "sglang": "sglang",
    "llama.cpp": "transformers",
    "torch": "transformers",
}
_COMPUTE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class ModelLayout:
    """Sizes and shapes of a decoder model for pipeline and tensor parallel planning.

    Attributes:
        name: a label (the model's folder or config stem).
        layer_names: the repeated blocks in model order (``model.layers.0`` ...).
        layer_nbytes: planning bytes of each block.
        layer_params: parameters of each block.
        pre_names, pre_nbytes, pre_params: modules before the first block (embeddings).
        post_names, post_nbytes, post_params: modules after the last block (norm, lm_head).
        tied_head_nbytes: bytes of an embedding the head shares (a copy on the last stage).
        hidden_size, num_heads, num_kv_heads, head_dim, vocab_size: from the config.
        max_positions: the config's ``max_position_embeddings`` (0 when absent).
        weight_dtype: the dtype weights are counted in.
        config: the transformers config, or ``None``.
        attention: the memory model's reading of the config (per-layer KV and activations),
            or ``None`` (hand-made layouts, configs it cannot read): then every layer caches
            ``2 * kv_heads * head_dim`` elements per token.
        num_experts, experts_per_token: routed experts of a MoE model and how many each token
            uses (0 for a dense model).
        layer_expert_nbytes, layer_expert_params: the routed experts' share of each block
            (``()`` for a dense model).
    """

    name: str
    layer_names: tuple[str, ...]
    layer_nbytes: tuple[int, ...]
    layer_params: tuple[int, ...]
    pre_names: tuple[str, ...]
    pre_nbytes: int
    pre_params: int
    post_names: tuple[str, ...]
    post_nbytes: int
    post_params: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int = 0
    tied_head_nbytes: int = 0
    weight_dtype: torch.dtype = torch.bfloat16
    config: Any = None
    attention: AttentionLayout | None = None
    num_experts: int = 0
    experts_per_token: int = 0
    layer_expert_nbytes: tuple[int, ...] = ()
    layer_expert_params: tuple[int, ...] = ()

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of activations and of an ``auto`` KV cache: the weights' dtype when it is
        a 16- or 32-bit float, else bfloat16 (fp8 / int weights compute in it, as vLLM's
        ``--dtype auto`` does for an fp8 checkpoint)."""
        return self.weight_dtype if self.weight_dtype in _COMPUTE_DTYPES else torch.bfloat16

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts and self.experts_per_token and self.layer_expert_nbytes)

    def expert_read_fraction(self, tokens: int) -> float:
        """Expected share of a layer's routed experts ``tokens`` tokens touch in one forward.

        Each token picks ``k`` of ``E`` experts; with routing spread evenly an expert is
        missed by all tokens with probability ``(1 - k/E) ** tokens``. DeepSeek-V3 (k 8 of
        E 256): 1 token reads 3.1%, 32 tokens 64%, a 2048-token prefill all of them.
        """
        if not self.is_moe:
            return 1.0
        return 1.0 - (1.0 - self.experts_per_token / self.num_experts) ** max(tokens, 1)

    def read_nbytes(self, layer: int, tokens: int) -> float:
        """Weight bytes block ``layer`` reads for a forward of ``tokens`` tokens (all of a
        dense block; the dense part plus the touched experts of a MoE block)."""
        if not self.is_moe:
            return self.layer_nbytes[layer]
        experts = self.layer_expert_nbytes[layer]
        dense = self.layer_nbytes[layer] - experts
        return dense + experts * self.expert_read_fraction(tokens)

    def active_params(self, layer: int) -> float:
        """Parameters one token computes with in block ``layer`` (``k / E`` of the experts)."""
        if not self.is_moe:
            return self.layer_params[layer]
        experts = self.layer_expert_params[layer]
        dense = self.layer_params[layer] - experts
        return dense + experts * self.experts_per_token / self.num_experts

    @property
    def total_nbytes(self) -> int:
        return sum(self.layer_nbytes) + self.pre_nbytes + self.post_nbytes

    def kv_bytes_per_layer(self, tokens: int, kv_bytes_per_element: float, tp: int) -> int:
        """KV cache bytes one device holds for one dense-attention layer and ``tokens`` tokens.

        ``2 (K, V) * tokens * ceil(kv_heads / tp) * head_dim * b``: with more TP ranks than
        KV heads each rank keeps one replicated head, as vLLM does. The figure of every layer
        of a layout without ``attention``; ``kv_cache_bytes`` is the per-layer figure.
        """
        heads_per_rank = max(1, math.ceil(self.num_kv_heads / tp))
        return int(2 * tokens * heads_per_rank * self.head_dim * kv_bytes_per_element)

    def kv_cache_bytes(
        self,
        batch: int,
        context: int,
        kv_dtype: torch.dtype | None,
        tp: int,
        engine: str = "vllm",
    ) -> tuple[int, ...]:
        """KV cache bytes one device of a ``tp``-rank group holds, per layer.

        From ``kv_cache_per_layer`` for ``engine``'s cache layout (``KV_ENGINES``): head-split
        layers keep ``ceil(kv_heads / tp)`` of ``kv_heads`` heads' bytes, an MLA layer's latent
        and a state-space layer's state stay whole on every rank.

        Args:
            batch: sequences cached.
            context: tokens per sequence.
            kv_dtype: the cache's dtype; ``None`` means ``compute_dtype``.
            tp: tensor-parallel ranks sharing each layer.
            engine: a cluster engine (``"vllm"``, ``"sglang"``, ``"llama.cpp"``, ``"torch"``).

        Returns:
            One figure per layer, in model order.

        Example:
            >>> layout = ModelLayout.from_opened(open_model("deepseek-v3"))  # doctest: +SKIP
            >>> layout.kv_cache_bytes(1, 1000, None, 8)[0]  # 1000 * (512 + 64) * 2 B, any TP
            1152000
        """
        dtype = kv_dtype or self.compute_dtype
        layers = None
        if self.attention is not None and len(self.attention.layers) == self.num_layers:
            layers = kv_cache_per_layer(
                self.attention,
                batch=batch,
                context=context,
                kv_dtype=dtype,
                model_dtype=self.compute_dtype,
                engine=KV_ENGINES.get(engine, "transformers"),  # type: ignore[arg-type]
                cache="static",
            )
        if layers is None:
            b = torch.empty((), dtype=dtype).element_size()
            return (self.kv_bytes_per_layer(batch * context, b, tp),) * self.num_layers
        per_rank = []
        for layer in layers:
            heads = layer.attention.kv_heads
            split = layer.self_nbytes + layer.cross_nbytes
            if layer.attention.kind != "mla" and heads > 0:
                split = math.ceil(split * max(1, math.ceil(heads / tp)) / heads)
            per_rank.append(split + layer.state_nbytes)
        return tuple(per_rank)

    def activation_bytes(self, chunk_tokens: int, dtype: torch.dtype, tp: int) -> int:
        """Activation bytes one device needs for a prefill chunk of ``chunk_tokens`` tokens.

        The memory model's prefill peak (``activation_peak`` with flash attention, the
        logits of one position per sequence as a serving engine samples them) split over
        ``tp`` ranks (each holds its shard of the intermediate, of the heads and of the
        vocabulary). Engines prefill in chunks (vLLM ``--max-num-batched-tokens``, SGLang
        ``--chunked-prefill-size``), so the context length does not enter here; it sizes the
        KV cache. Without ``attention`` (a hand-made layout): the larger of the gated MLP's
        outputs and the fp32 logits of the chunk, ``max(T * 2 * 4 H * 2, T * V * 4) / tp``.
        """
        if self.attention is None:
            largest = max(
                chunk_tokens * 2 * 4 * self.hidden_size * 2,
                chunk_tokens * self.vocab_size * 4,
            )
            return math.ceil(largest / tp)
        peak = activation_peak(
            self.attention,
            batch=1,
            tokens=chunk_tokens,
            dtype=dtype if dtype in _COMPUTE_DTYPES else self.compute_dtype,
            attention="flash_attention_2",
            logits_to_keep=1,
            cache="static",
        )
        return math.ceil(peak.prefill_nbytes / tp)

    @classmethod
    def from_opened(cls, opened: OpenedModel) -> ModelLayout:
        """Read the layout of an opened model (its tree's bytes and its config's shapes).

        Raises:
            BadInputError: a model without no-split blocks (nothing to pipeline), or a config
                without hidden size, heads or vocabulary.
        """
        tree = opened.tree
        layers = [
            node
            for node in tree.iter_nodes()
            if node.no_split and (node.parent is None or not _inside_no_split(node.parent))
        ]
        if not layers:
            raise BadInputError(
                f"{opened.label}: the model declares no repeated blocks (_no_split_modules), "
                "so it cannot be split into pipeline stages"
            )
        layer_prefixes = tuple(node.name + "." for node in layers)
        pre: dict[str, None] = {}
        post: dict[str, None] = {}
        pre_nbytes = post_nbytes = 0
        seen_layer = False
        position = {name: i for i, name in enumerate(tree.leaf_tensors)}
        for tensor in sorted(tree.tensor_nbytes, key=lambda t: position.get(t, 0)):
            owner = tree.tensor_owner.get(tensor, "")
            if (owner + ".").startswith(layer_prefixes):
                seen_layer = True
                continue
            if seen_layer:
                post[owner] = None
                post_nbytes += tree.tensor_nbytes[tensor]
            else:
                pre[owner] = None
                pre_nbytes += tree.tensor_nbytes[tensor]
        tied_head = 0
        tied_params = 0
        for group in tree.tied_groups:
            counted = [name for name in group if name in tree.tensor_nbytes]
            aliases_after = [
                name for name in group if name not in tree.tensor_nbytes and seen_layer
            ]
            if counted and tree.tensor_owner.get(counted[0], "") in pre and aliases_after:
                tied_head += tree.tensor_nbytes[counted[0]]
                owner = tree.node(tree.tensor_owner[counted[0]])
                tied_params += owner.param_count
        text = (
            opened.config.get_text_config()
            if hasattr(opened.config, "get_text_config")
            else opened.config
        )
        hidden = _first(text, ("hidden_size", "n_embd", "d_model"))
        heads = _first(text, ("num_attention_heads", "n_head", "num_heads"))
        vocab = _first(text, ("vocab_size",))
        if not (hidden and heads and vocab):
            raise BadInputError(
                f"{opened.label}: config has no hidden size, heads or vocab_size; "
                "the cluster planner needs a decoder language model"
            )
        kv_heads = _first(text, ("num_key_value_heads", "num_kv_heads")) or heads
        head_dim = _first(text, ("head_dim",)) or hidden // heads
        num_experts = _first(text, ("n_routed_experts", "num_local_experts", "num_experts")) or 0
        experts_per_token = _first(text, ("num_experts_per_tok", "moe_topk")) or 0
        experts = [_routed_experts(node) for node in layers]
        return cls(
            name=opened.label,
            layer_names=tuple(node.name for node in layers),
            layer_nbytes=tuple(node.nbytes for node in layers),
            layer_params=tuple(node.param_count for node in layers),
            pre_names=tuple(pre),
            pre_nbytes=pre_nbytes,
            pre_params=sum(tree.node(name).param_count for name in pre if name in tree),
            post_names=tuple(post),
            post_nbytes=post_nbytes,
            post_params=sum(tree.node(name).param_count for name in post if name in tree)
            + tied_params,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=vocab,
            max_positions=_first(text, ("max_position_embeddings", "n_positions")) or 0,
            tied_head_nbytes=tied_head,
            weight_dtype=_weight_dtype(opened),
            config=opened.config,
            attention=_attention_layout(opened.config),
            num_experts=num_experts if any(experts) else 0,
            experts_per_token=experts_per_token if any(experts) else 0,
            layer_expert_nbytes=tuple(e[0] for e in experts) if any(experts) else (),
            layer_expert_params=tuple(e[1] for e in experts) if any(experts) else (),
        )


def _attention_layout(config: Any) -> AttentionLayout | None:
    """The memory model's reading of ``config``; ``None`` when it cannot read it (the dense
    per-head figure is used then)."""
    try:
        return read_attention_layout(config, warn=False)
    except BadInputError:
        return None


def _routed_experts(layer: Any) -> tuple[int, int]:
    """``(bytes, params)`` of the routed experts inside a block: its ``experts`` module
    (transformers' fused ``*Experts`` or a ``ModuleList``), never ``shared_experts``."""
    nbytes = params = 0
    stack = list(layer.children)
    while stack:
        node = stack.pop()
        if node.short_name == "experts":
            nbytes += node.nbytes
            params += node.param_count
        else:
            stack.extend(node.children)
    return nbytes, params


def _inside_no_split(node: Any) -> bool:
    while node is not None:
        if node.no_split:
            return True
        node = node.parent
    return False


def _first(config: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _weight_dtype(opened: OpenedModel) -> torch.dtype:
    dtype = opened.planning_dtype or opened.declared_dtype
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.bfloat16
