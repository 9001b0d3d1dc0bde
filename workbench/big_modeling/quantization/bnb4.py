"""NF4 / FP4 weights with bitsandbytes' 4-bit kernels, as a plain-tensor wrapper subclass.

Why bitsandbytes and not torchao's ``NF4Tensor`` (measured on this project's 2-core CPU box,
torch 2.13 CPU, bitsandbytes 0.50.2, torchao 0.18, ``bfloat16[1024, 1024]`` weight, one token):

- formats: bitsandbytes has nf4 *and* fp4, each with or without double quantisation of the
  absmax (``compress_statistics``); torchao's ``NF4Tensor`` is nf4 only and always double
  quantises (int8 scalers per 256 blocks, a bf16 factor each), a layout ``sizes`` does not plan;
- bytes: bitsandbytes stores exactly what ``sizes.quantized_weight_nbytes`` predicts
  (589,888 B for nf4, 542,020 B for nf4-dq; ``NF4Tensor``: 540,834 B);
- forward error against the bf16 matmul: 0.094 (relative L2) for both on a N(0, 0.02) weight;
- decode (one token, median): ``bnb.matmul_4bit`` 1.3-2.8 ms against 5.9 ms for ``F.linear``
  on an ``NF4Tensor`` (which dequantises the whole weight every call); at ``[2048, 2048]`` on the
  shared, loaded box 66 ms against 424 ms (bf16 24 ms, torchao int4 24 ms); quantising a
  ``[1024, 1024]`` weight: 0.17 s against 0.62 s.

``Bnb4bitTensor`` keeps bitsandbytes' canonical (portable) layout, not the AVX512 CPU repack, so
the same bytes run on CPU and CUDA and can be written to an offload folder as plain safetensors
(``packed.flatten_packed``). A 3-D weight (fused MoE experts ``[E, N, K]``) is quantized one
expert at a time; indexing it by expert (what transformers' eager experts forward does) gives
that expert's 2-D ``Bnb4bitTensor``.

On the CPU a linear dequantizes into a buffer reused per thread (``bnb4_cpu``: bitsandbytes'
kernels, no per-call blocks left to fragment the heap); on CUDA it is ``bnb.matmul_4bit``.

bitsandbytes is imported on first use: without it, quantizing or running such a weight raises
``BadInputError`` saying to install it.

Example:
    >>> weight = torch.randn(128, 256, dtype=torch.bfloat16)
    >>> packed = quantize_4bit(weight, "nf4")  # doctest: +SKIP
    >>> torch.nn.functional.linear(torch.ones(1, 256, dtype=torch.bfloat16), packed).shape  # doctest: +SKIP
    torch.Size([1, 128])
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import return_and_correct_aliasing
from torchao.utils import TorchAOBaseTensor

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.quantization.bnb4_cpu import linear_4bit_cpu
from workbench.big_modeling.quantization.precisions import Precision, parse_precision

aten = torch.ops.aten

_INSTALL_HINT = (
    "install bitsandbytes (pip install 'bitsandbytes>=0.50'; it has CPU and CUDA 4-bit kernels)"
)


def require_bitsandbytes() -> Any:
    """The ``bitsandbytes`` module, or ``BadInputError`` saying to install it.

    Raises:
        BadInputError: bitsandbytes is not installed (or fails to import).
    """
    try:
        import bitsandbytes  # noqa: PLC0415 (optional and heavy)
    except ImportError as error:
        raise BadInputError(
            f"nf4/fp4 weights need bitsandbytes, which is not importable ({error}); {_INSTALL_HINT}"
        ) from error
    return bitsandbytes


class Bnb4bitTensor(TorchAOBaseTensor):
    """A bitsandbytes 4-bit weight (nf4/fp4, optionally double quantized) of shape ``shape``.

    Inner tensors (one row per expert for a 3-D weight, leading dims ``L = shape[:-2]``):

    - ``packed`` ``(*L, ceil(N*K/2))`` uint8: two 4-bit codes per byte;
    - ``absmax`` ``(*L, B)`` with ``B = ceil(N*K/blocksize)``: float32, or uint8 when nested;
    - ``code`` ``(*L, 16)`` float32: the 4-bit code book;
    - nested only: ``nested_absmax`` ``(*L, ceil(B/256))`` float32, ``nested_code`` ``(*L, 256)``
      float32, ``offset`` ``(*L,)`` float32.

    Attributes:
        quant_type: ``"nf4"`` or ``"fp4"``.
        blocksize: weights per absmax (64).
        shape: the logical weight shape; ``dtype`` is the compute dtype it reports.
    """

    tensor_data_names = ["packed", "absmax", "code"]
    tensor_attribute_names = ["quant_type", "blocksize", "weight_shape", "dtype"]
    optional_tensor_data_names = ["nested_absmax", "nested_code", "offset"]

    def __new__(
        cls,
        packed: torch.Tensor,
        absmax: torch.Tensor,
        code: torch.Tensor,
        quant_type: str,
        blocksize: int,
        weight_shape: list[int],
        dtype: torch.dtype,
        nested_absmax: torch.Tensor | None = None,
        nested_code: torch.Tensor | None = None,
        offset: torch.Tensor | None = None,
    ) -> Bnb4bitTensor:
        kwargs = {"device": packed.device, "dtype": dtype, "requires_grad": False}
        return torch.Tensor._make_wrapper_subclass(cls, torch.Size(weight_shape), **kwargs)  # type: ignore[attr-defined]

    def __init__(
        self,
        packed: torch.Tensor,
        absmax: torch.Tensor,
        code: torch.Tensor,
        quant_type: str,
        blocksize: int,
        weight_shape: list[int],
        dtype: torch.dtype,
        nested_absmax: torch.Tensor | None = None,
        nested_code: torch.Tensor | None = None,
        offset: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.packed = packed
        self.absmax = absmax
        self.code = code
        self.quant_type = quant_type
        self.blocksize = int(blocksize)
        self.weight_shape = [int(size) for size in weight_shape]
        self.nested_absmax = nested_absmax
        self.nested_code = nested_code
        self.offset = offset

    @property
    def nested(self) -> bool:
        """Whether the absmax values are double quantized."""
        return self.nested_absmax is not None

    def expert(self, index: int) -> Bnb4bitTensor:
        """The 2-D weight of expert ``index`` of a 3-D (fused experts) weight."""
        if len(self.weight_shape) != 3:
            raise BadInputError(f"a {self.weight_shape} 4-bit weight has no experts to index")
        index = int(index)
        parts = {name: getattr(self, name)[index] for name in self.tensor_data_names}
        nested = {
            name: None if getattr(self, name) is None else getattr(self, name)[index]
            for name in self.optional_tensor_data_names
        }
        return Bnb4bitTensor(
            parts["packed"],
            parts["absmax"],
            parts["code"],
            self.quant_type,
            self.blocksize,
            self.weight_shape[1:],
            self.dtype,
            **nested,
        )

    def quant_state(self) -> Any:
        """bitsandbytes' ``QuantState`` of a 2-D weight, built from the inner tensors."""
        functional = require_bitsandbytes().functional
        state2 = None
        if self.nested:
            state2 = functional.QuantState(
                absmax=self.nested_absmax, code=self.nested_code, blocksize=256, dtype=torch.float32
            )
        return functional.QuantState(
            absmax=self.absmax,
            shape=torch.Size(self.weight_shape),
            code=self.code,
            blocksize=self.blocksize,
            quant_type=self.quant_type,
            dtype=self.dtype,
            offset=self.offset,
            state2=state2,
        )

    def dequantize(self) -> torch.Tensor:
        """The weight in ``dtype`` (a 2-D weight)."""
        functional = require_bitsandbytes().functional
        return functional.dequantize_4bit(self.packed.view(-1, 1), self.quant_state())


def quantize_4bit(weight: torch.Tensor, precision: Precision | str) -> Bnb4bitTensor:
    """The ``Bnb4bitTensor`` of a 2-D or 3-D (experts ``[E, N, K]``) weight, on its device.

    Args:
        weight: a floating tensor on CPU or CUDA.
        precision: ``nf4``, ``nf4-dq``, ``fp4`` or ``fp4-dq``.

    Returns:
        The packed weight reporting ``weight``'s shape and dtype.

    Raises:
        BadInputError: another precision, a weight that is not 2-D/3-D, or no bitsandbytes.
    """
    precision = parse_precision(precision)
    if precision.kind not in ("nf4", "fp4"):
        raise BadInputError(f"quantize_4bit makes nf4/fp4 weights, not {precision.name}")
    if weight.dim() == 3:
        experts = [_quantize_2d(expert, precision) for expert in weight.unbind(0)]
        stacked = {
            name: torch.stack([getattr(expert, name) for expert in experts])
            for name in Bnb4bitTensor.tensor_data_names
        }
        nested = {
            name: torch.stack([getattr(expert, name) for expert in experts])
            if precision.double_quant
            else None
            for name in Bnb4bitTensor.optional_tensor_data_names
        }
        return Bnb4bitTensor(
            stacked["packed"],
            stacked["absmax"],
            stacked["code"],
            precision.kind,
            precision.group_size or 64,
            list(weight.shape),
            weight.dtype,
            **nested,
        )
    if weight.dim() != 2:
        raise BadInputError(f"nf4/fp4 quantize 2-D or 3-D weights, not {list(weight.shape)}")
    return _quantize_2d(weight, precision)


def _quantize_2d(weight: torch.Tensor, precision: Precision) -> Bnb4bitTensor:
    functional = require_bitsandbytes().functional
    packed, state = functional.quantize_4bit(
        weight.detach().contiguous(),
        blocksize=precision.group_size or 64,
        quant_type=precision.kind,
        compress_statistics=precision.double_quant,
    )
    nested: dict[str, torch.Tensor | None] = {"nested_absmax": None, "nested_code": None}
    offset = None
    if state.nested:
        nested = {"nested_absmax": state.state2.absmax, "nested_code": state.state2.code}
        offset = state.offset.reshape(())
    return Bnb4bitTensor(
        packed.view(-1),
        state.absmax,
        state.code,
        precision.kind,
        state.blocksize,
        list(weight.shape),
        weight.dtype,
        offset=offset,
        **nested,
    )


implements = Bnb4bitTensor.implements
implements_torch_function = Bnb4bitTensor.implements_torch_function


@implements(aten.linear.default)
@implements_torch_function(torch.nn.functional.linear)
def _linear(func: Any, types: Any, args: Any, kwargs: Any) -> torch.Tensor:
    activation, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    if len(weight.weight_shape) != 2:
        raise BadInputError(
            f"linear needs a 2-D weight, this 4-bit weight is {weight.weight_shape}"
        )
    bnb = require_bitsandbytes()
    if activation.device.type == "cpu" and weight.device.type == "cpu":
        return linear_4bit_cpu(activation, weight, bias)
    packed = weight.packed.view(-1, 1)
    state = weight.quant_state()
    if activation.dtype != weight.dtype:
        activation = activation.to(weight.dtype)
    return bnb.matmul_4bit(activation, packed.t(), quant_state=state, bias=bias)


@implements(aten.select.int)
def _select(func: Any, types: Any, args: Any, kwargs: Any) -> Bnb4bitTensor:
    weight, dim, index = args[0], args[1], args[2]
    if dim != 0:
        raise BadInputError(f"a 4-bit weight can only be indexed by expert (dim 0), not dim {dim}")
    return return_and_correct_aliasing(func, args, kwargs, weight.expert(index))


@implements(aten.index.Tensor)
def _index(func: Any, types: Any, args: Any, kwargs: Any) -> Bnb4bitTensor:
    weight, indices = args[0], args[1]
    if len(indices) != 1 or indices[0] is None or indices[0].numel() != 1:
        raise BadInputError("a 4-bit experts weight is indexed by one expert at a time")
    expert = weight.expert(int(indices[0].reshape(())))
    return return_and_correct_aliasing(func, args, kwargs, expert)
