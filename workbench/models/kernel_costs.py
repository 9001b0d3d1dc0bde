"""What a precision costs to compute: each weight format's decode kernel, as a fraction of the
16-bit kernel's effective memory bandwidth, per backend.

Decode at batch 1 reads every weight once per token, so a layer's time is its stored bytes over
the bandwidth its kernel reaches. A 16-bit weight is read at ``mbu x M`` (the speed model's
``MEMORY_BANDWIDTH_UTILIZATION`` of the device's bandwidth). A quantized weight is read at
``efficiency x mbu x M``: its kernel also unpacks, scales or dequantizes, and on some backends
it materializes a 16-bit copy first. So

    weight_read_s = stored_bytes / (M * mbu * efficiency(backend, kind))

and a format is faster than 16-bit only when ``efficiency`` beats its byte ratio (for int8,
about 0.5: half the bytes must be read at more than half the rate).

The table (``efficiency`` per backend and precision kind, ``"plain"`` = a cast dtype = 1.0):

======  =====  =====  =====  =====  =====  =====================================================
row     int8   int4   fp8    nf4    fp4    source
======  =====  =====  =====  =====  =====  =====================================================
cuda    0.785  0.535  0.703  0.956  0.956  NOT measured here: documented figures, see below
cpu     0.26   0.42   0.05   0.07   0.05   measured on the project's CPU machine (see below);
                                           ``detect_hardware`` uses this machine's own probe
======  =====  =====  =====  =====  =====  =====================================================

CUDA row (documented, not measured here):

- int8 / int4 / fp8: torchao's own Llama-3.1-8B decode benchmark on one H100, batch 1
  (``torchao/quantization/README.md``, "CUDA backend | NVIDIA-H100 GPU": memory bandwidth
  achieved 1904.75 GB/s bf16, 1495.41 int8wo, 1019.14 int4wo-64, 1339.93 float8wo), so
  0.785, 0.535 and 0.703 of the bf16 kernel. The A100 table there agrees within 2 %
  (Llama-3-8B: 1435.54, 1150.80, 763.33 GB/s). Those runs use ``torch.compile``, which fuses
  the int8 dequantization; eager transformers code is slower for int8 (see the CPU row).
- nf4 / fp4: bitsandbytes 0.40.0 release notes, "Efficient 4-bit Inference": 3.4x the 16-bit
  matmul speed at batch 1 on Ampere for inner dimensions of 4096 or more; over 4.5 stored bits
  that is ``3.4 x 4.5 / 16 = 0.956`` of the 16-bit kernel's bandwidth (Ada/Hopper's 4.0x would
  exceed 1, so the Ampere figure is taken). A kernel figure: whole-model generation is slower.

CPU row: the project's 2-core AMD EPYC (torch 2.13 CPU, torchao 0.18, bitsandbytes 0.50),
2026-12-02. int8 and int4 come from ``benchmarks/bench_quantized.py``'s whole-model decode of
a 200M demo Llama: int8 at 0.51x the bf16 speed over 0.503 of its bytes (0.26), int4-g64 at
1.50x over 0.281 (0.42). fp8, nf4 and fp4 come from ``device_probe.measure_cpu_kernels``
(one-token matmuls through the loader's own quantization: torchao's ``Int8Tensor`` casts the
int8 weight to bf16 before each matmul, ``Int4OpaqueTensor`` runs tinygemm's CPU kernel,
``Float8Tensor`` dequantizes, bitsandbytes' 4-bit CPU matmul), median of seven probes taken
while the machine ran other jobs (single probes spread 10x, so only the order of magnitude is
trusted). A machine with AVX-512 or AMX kernels differs, which is why the detected profile
measures its own (``HardwareProfile.kernel_costs``, ``cpu_measured``).

Example:
    >>> DEFAULT_KERNEL_COSTS.efficiency(0, "int4-g128")
    0.535
    >>> DEFAULT_KERNEL_COSTS.efficiency("cpu", "bfloat16")
    1.0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.quantization.precisions import parse_precision

MEMORY_BANDWIDTH_UTILIZATION = 0.8
"""The fraction of a device's peak memory bandwidth a 16-bit decode kernel reaches."""

PRECISION_KINDS: tuple[str, ...] = ("plain", "int8", "int4", "fp8", "nf4", "fp4")
"""The precision kinds the table has a figure for (``Precision.kind``; ``"plain"``: a dtype)."""

DOCUMENTED_CUDA: Mapping[str, float] = MappingProxyType(
    {"plain": 1.0, "int8": 0.785, "int4": 0.535, "fp8": 0.703, "nf4": 0.956, "fp4": 0.956}
)
DOCUMENTED_CPU: Mapping[str, float] = MappingProxyType(
    {"plain": 1.0, "int8": 0.26, "int4": 0.42, "fp8": 0.05, "nf4": 0.07, "fp4": 0.05}
)


def precision_kind(precision: str) -> str:
    """The table's kind for a precision name: ``"int4-g64"`` -> ``"int4"``, ``"bf16"`` ->
    ``"plain"``; an unknown name is ``"plain"`` (it is planned as loaded)."""
    try:
        kind = parse_precision(precision).kind
    except BadInputError:
        return "plain"
    return "plain" if kind == "dtype" else kind


@dataclass(frozen=True)
class KernelCosts:
    """Per-backend decode kernel efficiency of each precision kind (module docs).

    Attributes:
        cpu: ``{kind: efficiency}`` for layers executed on the CPU.
        cuda: the same for layers executed on a GPU.
        cpu_measured: whether ``cpu`` was measured on this machine (else documented defaults).
    """

    cpu: Mapping[str, float] = field(default_factory=lambda: dict(DOCUMENTED_CPU))
    cuda: Mapping[str, float] = field(default_factory=lambda: dict(DOCUMENTED_CUDA))
    cpu_measured: bool = False

    def efficiency(self, device: int | str, precision_or_kind: str) -> float:
        """The fraction of the 16-bit kernel's bandwidth ``device`` reaches on this precision
        (a GPU index reads the ``cuda`` row, anything else the ``cpu`` row); 1.0 if unknown."""
        kind = (
            precision_or_kind
            if precision_or_kind in PRECISION_KINDS
            else precision_kind(precision_or_kind)
        )
        row = self.cuda if isinstance(device, int) else self.cpu
        value = row.get(kind, 1.0)
        return value if value > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"cpu": dict(self.cpu), "cuda": dict(self.cuda), "cpu_measured": self.cpu_measured}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KernelCosts:
        """Rebuild from ``to_dict``; missing kinds take the documented defaults.

        Raises:
            ValueError: a figure that is not a number above 0.
        """
        rows = {}
        for key, default in (("cpu", DOCUMENTED_CPU), ("cuda", DOCUMENTED_CUDA)):
            given = data.get(key) or {}
            row = dict(default)
            for kind, value in dict(given).items():
                number = float(value)
                if not number > 0:
                    raise ValueError(f"kernel cost {key}.{kind} must be above 0, got {value!r}")
                row[str(kind)] = number
            rows[key] = row
        return cls(rows["cpu"], rows["cuda"], bool(data.get("cpu_measured", False)))


DEFAULT_KERNEL_COSTS = KernelCosts()
"""The documented table, for bundled and user profiles that give none."""
