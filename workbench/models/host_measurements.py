"""This machine's host measurements, taken again on request.

The detected profile's speed figures rest on three probes, each measured once per machine and
cached under the CPU, the thread count and the library versions: the host's cost per module
call and per forward (``dispatch_probe``), the CPU's one-token matmul time by weight size
and prefill FLOP/s per dtype (``matmul_probe``) and its quantized kernels' read rates
(``device_probe.cached_cpu_kernels``).
A first measurement taken while the machine was busy stays until it is taken again:
``measure_host_again`` measures all three now (the first two in fresh processes; 10 to 40 s
on two cores), each replacing the earlier figure as it finishes, so a stopped measurement
keeps the rest. ``workbench measure`` and the window's
Tools > Measure this machine again run it.

Example:
    >>> measured = measure_host_again()  # doctest: +SKIP
    >>> measured.lines()[0]  # doctest: +SKIP
    'dispatch: 27.1 us per module call, 0.45 ms per forward (2 threads)'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from workbench.models.cache_dirs import CONTENDED_RETRY_S
from workbench.models.device_probe import CpuKernelProbe, cached_cpu_kernels
from workbench.models.dispatch_probe import (
    ELEMENTWISE_LAYER_PARAMS,
    ELEMENTWISE_WIDTH,
    DispatchOverhead,
    cached_dispatch_overhead,
)
from workbench.models.machine_load import contended
from workbench.models.matmul_probe import MatmulCurve, cached_matmul_curve

__all__ = ["HostMeasurements", "measure_host_again"]

_CURVE_EXAMPLE_BYTES = 2**20  # the curve's figure the summary line quotes


@dataclass(frozen=True)
class HostMeasurements:
    """The three host probes as measured (``None``: that probe failed; typical values stand)."""

    dispatch: DispatchOverhead | None
    matmul_curve: MatmulCurve | None
    cpu_kernels: CpuKernelProbe | None

    def lines(self) -> list[str]:
        """One line per probe, for the CLI and the window's log."""
        out = []
        if self.dispatch is None:
            out.append("dispatch: not measured (see the log); typical 15 us per module call")
        else:
            d = self.dispatch
            elementwise = (
                f", elementwise work {d.elementwise_s * ELEMENTWISE_LAYER_PARAMS**0.5 * 1e6:.1f}"
                f" us a token in a {ELEMENTWISE_WIDTH}-wide layer"
                if d.elementwise_s > 0
                else ""
            )
            out.append(
                f"dispatch: {d.per_module_s * 1e6:.1f} us per module call, "
                f"{d.step_s * 1e3:.2f} ms per forward{elementwise} ({d.threads} threads)"
            )
        if self.matmul_curve is None:
            out.append("cpu matmul curve: not measured (see the log); bandwidth alone is used")
        else:
            times = [
                f"{dtype} {seconds * 1e6:.0f} us"
                for dtype in sorted(self.matmul_curve.points)
                if (seconds := self.matmul_curve.seconds(_CURVE_EXAMPLE_BYTES, dtype)) is not None
            ]
            line = f"cpu matmul curve: a 1 MiB weight takes {', '.join(times)}"
            if self.matmul_curve.prefill_flops:
                rates = ", ".join(
                    f"{dtype} {rate / 1e9:.1f}"
                    for dtype, rate in sorted(self.matmul_curve.prefill_flops.items())
                )
                line += f"; a 128-token prefill runs at {rates} GFLOP/s"
            if self.matmul_curve.transposed_prefill_rows_flops:
                rates = ", ".join(
                    f"{dtype} {points[-1][1] / 1e9:.1f}"
                    for dtype, points in sorted(
                        self.matmul_curve.transposed_prefill_rows_flops.items()
                    )
                )
                line += f", with (in, out) weights (GPT-2's Conv1D) at {rates} GFLOP/s"
            out.append(line)
        if self.cpu_kernels is None:
            out.append("cpu kernels: not measured (see the log); typical efficiencies are used")
        else:
            k = self.cpu_kernels
            kinds = ", ".join(f"{kind} {share:.2f}" for kind, share in sorted(k.efficiency.items()))
            out.append(f"cpu kernels: bf16 reads {k.bf16_gbps:.1f} GB/s; of that: {kinds}")
        probes = (self.dispatch, self.matmul_curve, self.cpu_kernels)
        for line_index, probe in enumerate(probes):
            if contended(probe):
                share = getattr(probe, "others_busy", 0.0)
                out[line_index] += (
                    f" (other processes took {share:.0%} of the CPU meanwhile: measured again "
                    f"when next asked for, at most every {CONTENDED_RETRY_S / 60:g} minutes, the "
                    "quieter figures kept)"
                )
        return out

    @property
    def complete(self) -> bool:
        """Whether every probe was measured."""
        return None not in (self.dispatch, self.matmul_curve, self.cpu_kernels)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostMeasurements:
        """The inverse of ``to_dict`` (``workbench measure --json``'s output)."""

        def build(kind: type, key: str) -> Any:
            value = data.get(key)
            return kind(**value) if isinstance(value, dict) else None

        return cls(
            dispatch=build(DispatchOverhead, "dispatch"),
            matmul_curve=build(MatmulCurve, "matmul_curve"),
            cpu_kernels=build(CpuKernelProbe, "cpu_kernels"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The probes as JSON data (``None`` for one that failed)."""
        return {
            "dispatch": asdict(self.dispatch) if self.dispatch else None,
            "matmul_curve": asdict(self.matmul_curve) if self.matmul_curve else None,
            "cpu_kernels": asdict(self.cpu_kernels) if self.cpu_kernels else None,
        }


def measure_host_again() -> HostMeasurements:
    """Measure this machine's host probes now, each cached in place of the one before as it
    finishes (a probe that fails or is stopped keeps the earlier figure)."""
    return HostMeasurements(
        dispatch=cached_dispatch_overhead(again=True),
        matmul_curve=cached_matmul_curve(again=True),
        cpu_kernels=cached_cpu_kernels(again=True),
    )
