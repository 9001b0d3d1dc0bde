"""A model as the cluster planner sees it: repeated blocks, what comes before and after them,
and the per-token shapes that size the KV cache and the traffic between devices.

``ModelLayout.from_opened`` reads everything from the opened model's tree (the bytes the
single-machine planner uses) and its config: the *layers* are the outermost no-split blocks
(``model.layers.N``); tensors met before the first layer (``model.embed_tokens``) go with the
first pipeline stage, tensors after the last (``model.norm``, ``lm_head``) with the last stage.
A tied ``lm_head`` costs the last stage a copy of the embedding when the pipeline has more than
one stage, as vLLM and SGLang load it there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.planning.activation_reserve import estimate_activation_reserve

if TYPE_CHECKING:
    from workbench.models.intake import OpenedModel


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
        config: the transformers config (for the activation reserve), or ``None``.
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

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    @property
    def total_nbytes(self) -> int:
        return sum(self.layer_nbytes) + self.pre_nbytes + self.post_nbytes

    def kv_bytes_per_layer(self, tokens: int, kv_bytes_per_element: float, tp: int) -> int:
        """KV cache bytes one device holds for one layer and ``tokens`` cached tokens.

        ``2 (K, V) * tokens * ceil(kv_heads / tp) * head_dim * b``: with more TP ranks than
        KV heads each rank keeps one replicated head, as vLLM does.
        """
        heads_per_rank = max(1, math.ceil(self.num_kv_heads / tp))
        return int(2 * tokens * heads_per_rank * self.head_dim * kv_bytes_per_element)

    def activation_bytes(self, chunk_tokens: int, dtype: torch.dtype, tp: int) -> int:
        """Activation bytes one device needs for a prefill chunk of ``chunk_tokens`` tokens.

        The workspace term of ``estimate_activation_reserve`` (its total minus its KV cache):
        the largest of the MLP's gate/up outputs, one layer's attention scores and the fp32
        logits, for one chunk, split over ``tp`` ranks (each holds its shard of the
        intermediate, of the heads and of the vocabulary). Engines prefill in chunks (vLLM
        ``--max-num-batched-tokens``, SGLang ``--chunked-prefill-size``), so the context
        length does not enter here; it sizes the KV cache.
        """
        if self.config is None:
            largest = max(
                chunk_tokens * 2 * 4 * self.hidden_size * 2,
                chunk_tokens * self.vocab_size * 4,
            )
            return math.ceil(largest / tp)
        total = estimate_activation_reserve(self.config, 1, chunk_tokens, dtype)
        b = torch.empty((), dtype=dtype).element_size()
        kv = 2 * self.num_layers * chunk_tokens * self.num_kv_heads * self.head_dim * b
        return math.ceil((total - kv) / tp)

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
        )


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
