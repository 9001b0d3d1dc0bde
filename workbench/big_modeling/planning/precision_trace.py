"""The joint planner's trace in words: where each precision went, and why each alternative
lost ("int8 everywhere would put model.layers.23-44 on cpu: 0.485 tok/s, 2.76x slower").

Example:
    >>> compact_layer_names(["m.layers.3", "m.layers.4", "lm_head"])
    'm.layers.3-4, lm_head'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from workbench.big_modeling.device_map.value import device_for
from workbench.big_modeling.devices import Device, device_label, device_sort_key
from workbench.big_modeling.planning.precision_candidates import PrecisionCandidate


def explain_choice(
    chosen: PrecisionCandidate,
    candidates: Sequence[PrecisionCandidate],
    layers: Sequence[str],
    tie_tolerance: float = 0.02,
) -> list[str]:
    """The choice in words: where each precision went, then why each other precision lost.

    Example line: ``"int8 everywhere would put model.layers.22-79 on cpu: 0.31 tok/s, 3.1x
    slower"``.
    """
    lines = [
        f"chose {chosen.label}: {chosen.tokens_per_s:.3g} tok/s, "
        f"{chosen.average_bits:.2f} bits/param average"
    ]
    lines += [f"  {group}" for group in _groups(chosen, layers)]
    alternatives = {c.label: c for c in candidates if c.layer_precisions != chosen.layer_precisions}
    for candidate in _notable(alternatives.values(), chosen):
        lines.append(_versus(candidate, chosen, layers))
    lines.append(
        f"speeds within {100 * tie_tolerance:g}% of the fastest count as ties; the tie with the "
        f"most bits wins ({len(candidates)} candidates considered)"
    )
    return lines


def _notable(
    alternatives: Iterable[PrecisionCandidate], chosen: PrecisionCandidate
) -> list[PrecisionCandidate]:
    """Uniform candidates, and the fastest mix of each precision pair, fastest first."""
    best_by_kind: dict[tuple[str, ...], PrecisionCandidate] = {}
    for candidate in alternatives:
        kind = tuple(sorted(set(candidate.layer_precisions)))
        current = best_by_kind.get(kind)
        if current is None or (candidate.tokens_per_s, candidate.average_bits) > (
            current.tokens_per_s,
            current.average_bits,
        ):
            best_by_kind[kind] = candidate
    return sorted(best_by_kind.values(), key=lambda c: -c.tokens_per_s)


def _versus(
    candidate: PrecisionCandidate, chosen: PrecisionCandidate, layers: Sequence[str]
) -> str:
    if not candidate.device_map:
        return f"{candidate.label} does not fit the budgets"
    spill = _spilled(candidate, chosen, layers)
    where = f" would put {spill}" if spill else ""
    if candidate.tokens_per_s > 0 and chosen.tokens_per_s > 0:
        ratio = chosen.tokens_per_s / candidate.tokens_per_s
        speed = f"{candidate.tokens_per_s:.3g} tok/s, " + (
            f"{ratio:.3g}x slower" if ratio >= 1 else f"{1 / ratio:.3g}x faster"
        )
    else:
        speed = f"{candidate.tokens_per_s:.3g} tok/s"
    bits = f", {candidate.average_bits:.2f} bits"
    reason = f" ({candidate.problem})" if candidate.problem else ""
    if not reason and candidate.tokens_per_s > chosen.tokens_per_s:
        # faster and feasible yet not chosen: only a speed tie with fewer bits loses
        reason = " (a speed tie: fewer bits)"
    return f"{candidate.label}{where}: {speed}{bits}{reason}"


def _spilled(
    candidate: PrecisionCandidate, chosen: PrecisionCandidate, layers: Sequence[str]
) -> str:
    """Layers the candidate puts on a slower device than the chosen plan does, in words."""
    moved: dict[Device, list[str]] = {}
    for layer in layers:
        mine = device_for(layer, candidate.device_map)
        theirs = device_for(layer, chosen.device_map)
        if (
            mine is not None
            and theirs is not None
            and device_sort_key(mine) > device_sort_key(theirs)
        ):
            moved.setdefault(mine, []).append(layer)
    return "; ".join(
        f"{compact_layer_names(names)} on {device_label(device)}"
        for device, names in sorted(moved.items(), key=lambda item: device_sort_key(item[0]))
    )


def _groups(candidate: PrecisionCandidate, layers: Sequence[str]) -> list[str]:
    """``"model.layers.0-39 int4-g128 on cuda:0"`` for each run of equal precision and device."""
    runs: list[tuple[str, Device | None, list[str]]] = []
    for layer, precision in zip(layers, candidate.layer_precisions, strict=True):
        device = device_for(layer, candidate.device_map)
        if runs and runs[-1][0] == precision and runs[-1][1] == device:
            runs[-1][2].append(layer)
        else:
            runs.append((precision, device, [layer]))
    return [
        f"{compact_layer_names(names)} {precision} on "
        f"{device_label(device) if device is not None else '?'}"
        for precision, device, names in runs
    ]


_NUMBERED = re.compile(r"^(.*\.)(\d+)$")


def compact_layer_names(names: Sequence[str]) -> str:
    """``["m.layers.3", "m.layers.4", "m.layers.9"]`` -> ``"m.layers.3-4, m.layers.9"``.

    Example:
        >>> compact_layer_names(["m.layers.3", "m.layers.4", "m.layers.9", "lm_head"])
        'm.layers.3-4, m.layers.9, lm_head'
    """
    parts: list[str] = []
    run: tuple[str, int, int] | None = None
    for name in names:
        match = _NUMBERED.match(name)
        if match and run and match.group(1) == run[0] and int(match.group(2)) == run[2] + 1:
            run = (run[0], run[1], run[2] + 1)
            continue
        if run:
            parts.append(_run_text(run))
            run = None
        if match:
            run = (match.group(1), int(match.group(2)), int(match.group(2)))
        else:
            parts.append(name)
    if run:
        parts.append(_run_text(run))
    return ", ".join(parts)


def _run_text(run: tuple[str, int, int]) -> str:
    prefix, first, last = run
    return f"{prefix}{first}" if first == last else f"{prefix}{first}-{last}"
