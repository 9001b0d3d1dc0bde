"""Which modules stay in the model's dtype when the rest is quantized, by default.

The defaults are the ones users of transformers' quantizers already get:

- ``transformers.quantizers.base.get_keys_to_not_convert(model)`` (used by the bitsandbytes,
  torchao, GPTQ and AWQ quantizers through ``HfQuantizer.get_modules_to_not_convert``): the
  output embeddings (``lm_head``), every weight tied to another, and the module holding the
  model's last parameter;
- embeddings and norms are never converted: the torchao and bitsandbytes quantizers convert
  ``nn.Linear`` only (``TorchAoHfQuantizer.param_needs_quantization``: ``_QUANTIZABLE =
  [torch.nn.Linear]`` unless ``include_input_output_embeddings``), so they need no entry;
- MoE routers (``*.gate`` / ``*.router`` modules beside an ``experts`` module, e.g.
  Mixtral's ``block_sparse_moe.gate``, Qwen-MoE's ``mlp.gate``): the models' quantization configs
  list them in ``modules_to_not_convert`` (``"re:.*mlp.gate$"`` in compressed-tensors and FP8
  checkpoints; ``_keep_in_fp32_modules`` in several MoE models), since a mis-routed token costs
  more than the bytes saved.

Users edit the list per module; ``default_keep_high_precision`` gives the starting point.

Example:
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 10))
    >>> default_keep_high_precision(model)  # the last Linear holds the last parameter
    ['2']
"""

from __future__ import annotations

from torch import nn

ROUTER_NAMES = ("gate", "router")
"""Last name components of MoE router Linear layers."""


def default_keep_high_precision(model: nn.Module) -> list[str]:
    """Module names whose Linear weights are not quantized by default, sorted.

    Args:
        model: the (meta) model.

    Returns:
        The output embeddings, modules with tied weights, the module of the last parameter, and
        MoE routers (module docs), those that hold a ``weight``. In transformers 5 a router is
        its own class (``MixtralTopKRouter``) and experts are fused 3-D parameters, which the
        Linear-only quantizers leave as they are; the router is listed all the same, for
        ``modules_to_not_convert``.
    """
    modules = dict(model.named_modules())
    keep: set[str] = set()
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if output is not None:
        keep |= {name for name, module in modules.items() if module is output}
    keep |= _tied_modules(model)
    parameters = list(model.named_parameters())
    if parameters:
        keep.add(parameters[-1][0].rpartition(".")[0])
    for name, module in modules.items():
        parent, _, last = name.rpartition(".")
        if last in ROUTER_NAMES and getattr(module, "weight", None) is not None:
            siblings = modules.get(parent)
            if siblings is not None and hasattr(siblings, "experts"):
                keep.add(name)
    return sorted(name for name in keep if getattr(modules.get(name), "weight", None) is not None)


def _tied_modules(model: nn.Module) -> set[str]:
    """Modules holding a weight reached under two names (what transformers ties)."""
    first_name: dict[int, str] = {}
    tied: set[str] = set()
    for name, parameter in model.named_parameters(remove_duplicate=False):
        owner = name.rpartition(".")[0]
        if id(parameter) in first_name:
            tied |= {owner, first_name[id(parameter)]}
        else:
            first_name[id(parameter)] = owner
    return tied
