"""Bytes of a weight after quantization, exact to the library layout that produces it.

Each quantized format is counted as the library that makes it stores it in memory (every
inner tensor of the quantized weight, from its storage), which the tests check against real
tensors quantized on CPU:

=============  =================================================================  ===========
precision      stored tensors for an ``(N, K)`` weight of dtype ``D``              library
=============  =================================================================  ===========
``int8``       qdata (N, K) int8; scale (N, 1) float32; zero_point (N, 1) int8     torchao
               -> ``N*K + 5*N``                                                    ``Int8Tensor``
``int4-gG``    qdata (N, K/2) uint8; scale_and_zero (K/G, N, 2) in ``D``           torchao
               -> ``N*K/2 + 2*(K/G)*N*itemsize(D)``; when ``K % G != 0`` torchao   ``Int4Opaque``
               skips the weight (it stays ``N*K*itemsize(D)``)                     ``Tensor``
``fp8``        qdata (N, K) float8_e4m3fn; scale (N, 1) float32 -> ``N*K + 4*N``   ``Float8Tensor``
``nf4``/``fp4``  packed (ceil(N*K/2), 1) uint8; absmax (B,) float32 with           bitsandbytes
               ``B = ceil(N*K/64)``; code (16,) float32 -> ``ceil(N*K/2) + 4B + 64``  ``QuantState``
``*-dq``       absmax (B,) uint8, nested absmax (ceil(B/256),) float32, nested     bitsandbytes
               code (256,) float32, offset () float32 ->                           ``compress_``
               ``ceil(N*K/2) + B + 4*ceil(B/256) + 1024 + 4 + 64``                 ``statistics``
dtypes         ``N*K*itemsize``                                                    torch
=============  =================================================================  ===========

Per parameter that is about 8.04 bits for int8 at K = 4096 (8 + 40/K), 4.25 for int4-g128 in
bfloat16 (4 + 32/128), 4.5 for nf4 (4 + 32/64) and 4.127 for nf4-dq (4 + 8/64 + 32/16384), the
figures bitsandbytes and torchao document.

Only the ``weight`` of ``nn.Linear`` modules and the fused 3-D MoE expert weights (transformers
5's ``experts.gate_up_proj [E, N, K]``; ``expert_layout``) are quantized; biases, norms and
embeddings keep their planning size. Fused experts are quantized one expert at a time on CPU
(``experts``), so an ``[E, N, K]`` weight takes exactly ``E`` times the ``(N, K)`` weight's bytes
(for ``int8``/``fp8``, torchao's 3-D layouts hold the same: per-row scales ``[E, N, 1]``).
``tensor_nbytes_under`` applies a precision map to a whole model's tensors; ``module_sizes_of``
sums them per module as the device-map planner wants them.

Example:
    >>> quantized_weight_nbytes("int4-g128", 4096, 4096, torch.bfloat16)  # 8 MiB + 4096*32*4
    8912896
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from workbench.big_modeling.quantization.expert_layout import fused_expert_shapes
from workbench.big_modeling.quantization.precisions import Precision, parse_precision

NF4_BLOCK = 64
"""bitsandbytes' 4-bit block (transformers' ``BitsAndBytesConfig`` default ``blocksize``)."""
NESTED_BLOCK = 256
"""bitsandbytes' block for double-quantized absmax values (``compress_statistics=True``)."""


def quantized_weight_nbytes(
    precision: str | Precision, out_features: int, in_features: int, dtype: torch.dtype
) -> int:
    """Bytes of an ``(out_features, in_features)`` Linear weight of ``dtype`` at ``precision``.

    Args:
        precision: a precision name or ``Precision`` (``"int4-g64"``, ``"nf4-dq"``, ``"bf16"``).
        out_features: N, the weight's rows.
        in_features: K, the weight's columns (what groups run along).
        dtype: the weight's dtype before quantization (int4 scales are stored in it).

    Returns:
        The bytes of every tensor the quantized weight holds (table in the module docs).

    Example:
        >>> quantized_weight_nbytes("int8", 256, 512, torch.bfloat16)  # 256*512 + 5*256
        132352
    """
    p = parse_precision(precision)
    n, k = int(out_features), int(in_features)
    if p.kind == "dtype":
        return n * k * p.dtype.itemsize  # type: ignore[union-attr]
    if p.kind == "int8":
        return n * k + 5 * n
    if p.kind == "fp8":
        return n * k + 4 * n
    if p.kind == "int4":
        group = p.group_size or 128
        if k % group:  # torchao leaves such a weight as it is
            return n * k * dtype.itemsize
        return n * k // 2 + 2 * (k // group) * n * dtype.itemsize
    numel = n * k
    blocks = -(-numel // NF4_BLOCK)
    packed = -(-numel // 2) + 16 * 4
    if p.double_quant:
        return packed + blocks + 4 * -(-blocks // NESTED_BLOCK) + NESTED_BLOCK * 4 + 4
    return packed + 4 * blocks


CUDA_TILE_K = 1024
"""torchao's CUDA ``tile_packed_to_4d`` int4 layout pads in_features to a multiple of this."""
CUDA_TILE_N = 8
"""... and out_features to a multiple of this (its default ``int4_tile_packed_ntile``)."""


def cuda_int4_tile_packed_nbytes(
    out_features: int, in_features: int, group_size: int, dtype: torch.dtype
) -> int:
    """Bytes of an int4 weight in torchao's CUDA ``tile_packed_to_4d`` layout (padded).

    That layout (``Int4TilePackedTo4dTensor``, PyTorch's tinygemm) is what a CUDA int4 load
    gets where mslk is not installed (``backends``); it pads the weight to ``(ceil8(N),
    ceil1024(K))`` before packing, so it holds more than ``quantized_weight_nbytes`` (the
    CPU and mslk ``plain`` layouts) whenever K % 1024 != 0. Taken from torchao 0.18's
    ``Int4TilePackedTo4dTensor.from_hp``; not checked on a GPU in this project's CI.

    Example:
        >>> cuda_int4_tile_packed_nbytes(4096, 11008, 128, torch.bfloat16)  # K padded to 11264
        24510464
    """
    n = -(-int(out_features) // CUDA_TILE_N) * CUDA_TILE_N
    k = -(-int(in_features) // CUDA_TILE_K) * CUDA_TILE_K
    return n * k // 2 + 2 * (k // group_size) * n * dtype.itemsize


def bits_per_weight(
    precision: str | Precision, in_features: int = 4096, dtype: torch.dtype = torch.bfloat16
) -> float:
    """Stored bits per weight element for a square-ish weight with ``in_features`` columns.

    Example:
        >>> round(bits_per_weight("nf4-dq"), 3), bits_per_weight("int4-g128")
        (4.127, 4.25)
    """
    n = 4096
    return 8 * quantized_weight_nbytes(precision, n, in_features, dtype) / (n * in_features)


def linear_weight_shapes(model: nn.Module) -> dict[str, tuple[int, int, torch.dtype]]:
    """``{tensor name: (out_features, in_features, dtype)}`` for every ``nn.Linear`` weight.

    Works on meta models (only shapes are read); a weight reached twice (tied) is listed once,
    under the first name, as the module tree counts it.

    Example:
        >>> linear_weight_shapes(nn.Sequential(nn.Linear(4, 2)))
        {'0.weight': (2, 4, torch.float32)}
    """
    shapes: dict[str, tuple[int, int, torch.dtype]] = {}
    seen: set[int] = set()
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, nn.Linear) or weight is None or weight.dim() != 2:
            continue
        if id(weight) in seen:
            continue
        seen.add(id(weight))
        rows, columns = weight.shape
        shapes[f"{name}.weight" if name else "weight"] = (int(rows), int(columns), weight.dtype)
    return shapes


def precision_of(module: str, precision_map: Mapping[str, str | Precision]) -> str | None:
    """The precision covering ``module``: its longest covering key in ``precision_map``.

    Example:
        >>> precision_of("model.layers.3.mlp", {"": "int4", "model.layers.3": "int8"})
        'int8'
    """
    name = module
    while True:
        value = precision_map.get(name)
        if value is not None:
            return value if isinstance(value, str) else value.name
        if not name:
            return None
        name = name.rpartition(".")[0]


@dataclass(frozen=True)
class QuantizableWeights:
    """What a precision map changes in a model, computed once per model.

    Attributes:
        shapes: ``linear_weight_shapes`` of the model plus its fused expert weights (each as
            one expert's ``(out, in, dtype)``), less the modules kept in high precision.
        planning_dtype: the dtype Linear weights are counted in before quantization (int4
            scales are stored in it); ``None``: each weight's own dtype.
        experts: ``{tensor: number of experts}`` for the fused expert weights in ``shapes``
            (their bytes are that many times one expert's).
    """

    shapes: Mapping[str, tuple[int, int, torch.dtype]]
    planning_dtype: torch.dtype | None = None
    experts: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        model: nn.Module,
        keep: Iterable[str] = (),
        planning_dtype: torch.dtype | None = None,
    ) -> QuantizableWeights:
        """The Linear and fused expert weights of ``model`` outside the modules in ``keep``."""
        kept = {name for name in keep if name}
        shapes = {
            tensor: shape
            for tensor, shape in linear_weight_shapes(model).items()
            if not _covered(tensor, kept)
        }
        experts: dict[str, int] = {}
        for tensor, (count, rows, columns, dtype) in fused_expert_shapes(model).items():
            if not _covered(tensor, kept):
                shapes[tensor] = (rows, columns, dtype)
                experts[tensor] = count
        return cls(shapes=shapes, planning_dtype=planning_dtype, experts=experts)


def _covered(tensor: str, prefixes: set[str]) -> bool:
    name = tensor
    while name:
        name = name.rpartition(".")[0]
        if name in prefixes:
            return True
    return False


def tensor_nbytes_under(
    precision_map: Mapping[str, str | Precision],
    base_nbytes: Mapping[str, int],
    weights: QuantizableWeights,
) -> dict[str, int]:
    """Every tensor's bytes once the precision map is applied.

    Args:
        precision_map: ``{module: precision}``; longest prefix wins, uncovered weights stay.
        base_nbytes: planning bytes per tensor without quantization (the module tree's).
        weights: the quantizable weights (``QuantizableWeights.of(model, keep)``).

    Returns:
        ``base_nbytes`` with each covered quantizable weight at its precision's size.
    """
    sizes = dict(base_nbytes)
    cache: dict[tuple[str, int, int, torch.dtype], int] = {}
    for tensor, (rows, columns, own_dtype) in weights.shapes.items():
        if tensor not in sizes:
            continue
        precision = precision_of(tensor.rpartition(".")[0], precision_map)
        if precision is None:
            continue
        dtype = weights.planning_dtype or own_dtype
        key = (precision, rows, columns, dtype)
        if key not in cache:
            cache[key] = quantized_weight_nbytes(precision, rows, columns, dtype)
        sizes[tensor] = cache[key] * weights.experts.get(tensor, 1)
    return sizes


def module_sizes_of(
    tensor_nbytes: Mapping[str, int], module_names: Iterable[str]
) -> dict[str, int]:
    """``{module: bytes of its tensors and its descendants'}`` for every name in ``module_names``.

    Example:
        >>> module_sizes_of({"a.b.weight": 8, "a.bias": 2}, ["", "a", "a.b"])
        {'': 10, 'a': 10, 'a.b': 8}
    """
    sizes = dict.fromkeys(module_names, 0)
    for tensor, nbytes in tensor_nbytes.items():
        name = tensor
        while name:
            name = name.rpartition(".")[0]
            if name in sizes:
                sizes[name] += nbytes
    return sizes
