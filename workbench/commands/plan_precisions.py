"""``workbench plan --precisions int4,int8,bf16 [--min-bits 4.5] [--keep-at-least first=int8]``:
plan precision and placement together (``runtime.precision_planning``).

The exported device map stays the plain transformers one; the JSON document gains a
``quantization`` section (precision map, kept modules, trace, every candidate) and
``--emit-code`` a ``quantization_config`` that transformers accepts.

Torch comes in only when the command runs: the CLI imports this module to build its parser.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any


def add_precision_arguments(parser: argparse.ArgumentParser) -> None:
    """The joint planner's flags on ``workbench plan``."""
    parser.add_argument(
        "--precisions",
        metavar="LIST",
        help="plan precision and placement together over these precisions, e.g. "
        "int4,int8,bf16 (int8, int4-g32/64/128, nf4[-dq], fp4[-dq], fp8, bf16, fp16, fp32)",
    )
    parser.add_argument(
        "--min-bits",
        type=float,
        help="with --precisions: least average stored bits per parameter, e.g. 4.5",
    )
    parser.add_argument(
        "--keep-at-least",
        nargs="+",
        metavar="LAYERS=PREC",
        default=[],
        help="with --precisions: layers that stay at or above a precision, e.g. "
        "first,last=int8 or 0-1=bf16 or model.layers.40=int8",
    )


def plan_precisions(
    args: argparse.Namespace,
    opened: Any,
    budgets: dict[int | str, int],
    reserve: dict[int | str, int],
    profile: Any,
) -> Any:
    """The joint plan for ``--precisions`` (``PrecisionPlanning``), the stored-size plan of a
    pre-quantized checkpoint (``PrequantizedPlanning``), or ``None`` for neither.

    Raises:
        BadInputError: ``--min-bits``/``--keep-at-least`` without ``--precisions``, bad values,
            or no plan meeting them.
    """
    from workbench.runtime import BadInputError  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.precision_planning import (  # noqa: PLC0415 (torch: not at CLI start)
        parse_keep_at_least,
        plan_opened_precisions,
        precision_layers,
    )
    from workbench.runtime.prequantized_planning import (  # noqa: PLC0415 (torch: not at CLI start)
        plan_prequantized,
        prequantized,
    )

    stored = prequantized(opened)
    if stored is not None:
        if args.precisions:
            raise BadInputError(
                f"{opened.label} is stored quantized ({stored.config.summary()}); it is planned "
                "at its stored sizes: drop --precisions"
            )
        return plan_prequantized(
            opened,
            stored,
            max_memory=budgets,
            profile=profile,
            strategy=args.strategy,
            reserve=reserve,
            prefetch=not args.no_prefetch,
            prompt_tokens=args.prompt_tokens,
        )
    if not args.precisions:
        if args.min_bits is not None or args.keep_at_least:
            raise BadInputError("--min-bits and --keep-at-least need --precisions, e.g. int4,int8")
        return None
    if args.min_bits is not None and not 0 < args.min_bits <= 32:
        raise BadInputError(f"--min-bits must be in (0, 32], got {args.min_bits:g}")
    floors = parse_keep_at_least(args.keep_at_least, precision_layers(opened.tree))
    return plan_opened_precisions(
        opened,
        max_memory=budgets,
        precisions=args.precisions,
        profile=profile,
        min_bits=args.min_bits,
        keep_at_least=floors,
        strategy=args.strategy,
        reserve=reserve,
        prefetch=not args.no_prefetch,
        prompt_tokens=args.prompt_tokens,
    )


def settle_joint_reserves(
    args: argparse.Namespace,
    opened: Any,
    budgets: dict[int | str, int],
    profile: Any,
    memory: Any,
    joint: Any,
) -> tuple[Any, dict[Any, int], dict[Any, str]]:
    """Re-plan a joint plan until each device's reserve is what the joint map itself needs
    (its layers' KV cache and activations, ``device_reserves``), as the GUI's comparison does
    (``precision_session.plan_joint``); the first pass used the plain-dtype plan's reserves.

    Returns:
        The settled joint plan, its reserve per device and the reserve's "why" per device.
    """
    from workbench.runtime.planning import device_reserves  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.precision_session import MAX_RESERVE_PASSES  # noqa: PLC0415 (torch: not at CLI start)

    kept: dict[Any, int] = {}
    why: dict[Any, str] = {}
    for _ in range(MAX_RESERVE_PASSES):
        needed = device_reserves(opened, joint.plan.device_map, memory, joint.plan.precision_map)
        settled = {device: r.nbytes for device, r in needed.items()}
        why = {device: r.why for device, r in needed.items()}
        if settled == kept:
            break
        kept = settled
        joint = plan_precisions(args, opened, budgets, kept, profile)
    return joint, kept, why


def as_plan_result(plan: Any, joint: Any) -> Any:
    """``plan`` (a ``PlanResult``) with the joint plan's device map and per-device bytes."""
    return dataclasses.replace(
        plan, device_map=joint.plan.device_map, per_device_bytes=joint.plan.per_device_bytes
    )


def sizes_words(opened: Any, joint: Any) -> str:
    """What the plan's bytes are counted at, for the text output's first line:
    ``"int4-g128 on 79 layers, int8 on 1; bfloat16 elsewhere"`` for a joint plan, the stored
    format for a checkpoint stored quantized (never the model's dtype alone: the total is not
    that dtype's size)."""
    from workbench.runtime import dtype_name  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.planning import planning_dtype  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.prequantized_planning import PrequantizedPlanning  # noqa: PLC0415 (torch: not at CLI start)

    if isinstance(joint, PrequantizedPlanning):
        return f"stored {joint.stored.config.summary()}"
    dtype = dtype_name(planning_dtype(opened))
    counts: dict[str, int] = {}
    for precision in joint.plan.precision_map.values():
        counts[precision] = counts.get(precision, 0) + 1
    if set(counts) <= {dtype}:
        return dtype
    ordered = sorted(counts.items(), key=lambda item: -item[1])
    runs = [
        f"{name} on {count} layer{'s' * (count != 1)}" if index == 0 else f"{name} on {count}"
        for index, (name, count) in enumerate(ordered)
    ]
    return f"{', '.join(runs)}; {dtype} elsewhere"


def precision_lines(joint: Any) -> list[str]:
    """The text output's precision lines and the trace."""
    from workbench.runtime.precision_planning import describe_precisions  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.prequantized_planning import PrequantizedPlanning  # noqa: PLC0415 (torch: not at CLI start)

    if isinstance(joint, PrequantizedPlanning):
        stored = joint.stored
        return [f"quantized  {stored.config.summary()} (stored; planned at the header sizes)"]
    return describe_precisions(joint)


def precision_document(joint: Any) -> dict[str, Any]:
    """The ``quantization`` section of ``--json``."""
    from workbench.runtime.precision_planning import quantization_section  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.prequantized_planning import (  # noqa: PLC0415 (torch: not at CLI start)
        PrequantizedPlanning,
        prequantized_section,
    )

    if isinstance(joint, PrequantizedPlanning):
        return prequantized_section(joint.stored)
    return quantization_section(joint)


def precision_code(opened: Any, joint: Any, budgets: dict[int | str, int], *, source: str) -> str:
    """``--emit-code`` for a joint plan: the ``from_pretrained`` call with its
    ``quantization_config`` (the runtime's one writer, ``map_code``)."""
    from workbench.runtime.map_code import (  # noqa: PLC0415 (torch: not at CLI start)
        checkpoint_location,
        from_pretrained_code,
    )
    from workbench.runtime.planning import planning_dtype  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.prequantized_planning import PrequantizedPlanning  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.quantization_code import quantization_config_code  # noqa: PLC0415 (torch: not at CLI start)

    location, placeholder = checkpoint_location(source, opened.folder)
    if isinstance(joint, PrequantizedPlanning):  # transformers reads its quantization_config
        return from_pretrained_code(
            model_class=opened.model_class,
            location=location,
            placeholder=placeholder,
            device_map=joint.plan.device_map,
            max_memory=budgets,
        )
    return from_pretrained_code(
        model_class=opened.model_class,
        location=location,
        placeholder=placeholder,
        device_map=joint.plan.device_map,
        max_memory=budgets,
        dtype=planning_dtype(opened),
        quantization=quantization_config_code(
            joint.plan.precision_map, joint.plan.keep_high_precision
        ),
    )
