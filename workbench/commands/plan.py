"""``workbench plan SOURCE``: infer a device map for budgets, write it, predict the speed.

Budgets come from ``--max-memory 0=24GiB cpu=64GiB disk=1TiB``, from ``--profile NAME`` (a
what-if machine; ``--max-memory`` entries override it), or, with neither, from this machine's
free memory. ``--emit-code`` prints the equivalent ``from_pretrained`` call. The plan is the
planner panel's: ``workbench.runtime.planning.plan_opened_model``.

By default the plan keeps the memory model's reserve, with the GUI's default options (batch 1,
the model's maximum context capped at 32768 tokens, the weights' dtype for the cache, one
prefill of the whole context): each device keeps free the KV cache of the layers it runs plus
their activation peak (``runtime.planning.device_reserves``, the numbers the GUI's lanes
show), and the output says why per device. ``--context``, ``--batch``, ``--kv-dtype``,
``--kv-engine``, ``--context-cap`` and ``--prefill-tokens`` change those options;
``--reserve DEVICE=SIZE`` keeps fixed bytes instead, and ``--no-reserve`` keeps nothing free,
as ``infer_auto_device_map`` does. Config keys the memory model does not understand are printed
as warnings (it then counts those layers as dense attention); a model it cannot read at all is
planned without a reserve, with a warning, unless a memory flag asked for one.

Torch comes in only when the command runs: the CLI imports this module to build its parser.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import warnings
from typing import Any

from workbench.commands.inspect import open_with_progress, stage_progress
from workbench.commands.plan_precisions import (
    add_precision_arguments,
    as_plan_result,
    plan_precisions,
    precision_code,
    precision_document,
    precision_lines,
    settle_joint_reserves,
    sizes_words,
)
from workbench.runtime import BadInputError
from workbench.runtime.model_kind import generates_tokens

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")  # runtime.planning's (torch)
KV_DTYPES = ("model", "fp16", "bf16", "fp8", "int8")  # runtime.planning's (torch)
KV_ENGINES = ("transformers", "transformers-4", "vllm", "sglang")  # runtime.planning's
DEFAULT_CONTEXT_CAP = 32768  # runtime.planning's, the GUI's "cap" default


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="plan a device map for memory budgets and predict its speed",
        description="Infer a device map (GPUs, then CPU, then disk) for a model and budgets, "
        "write it as JSON, print per-device totals and the predicted decode speed.",
    )
    parser.add_argument("source", help="config.json, model folder, hf-cache:REPO, or bundled name")
    parser.add_argument(
        "--max-memory",
        nargs="+",
        metavar="DEVICE=SIZE",
        default=[],
        help="budgets, e.g. 0=24GiB cpu=64GiB disk=1TiB",
    )
    parser.add_argument("--strategy", default="auto", choices=STRATEGIES)
    parser.add_argument(
        "--reserve",
        nargs="+",
        metavar="DEVICE=SIZE",
        default=[],
        help="memory kept free for activations, e.g. 0=2GiB, instead of the memory model's "
        "reserve; 'auto' (the default): per device, the KV cache of the layers it runs plus "
        "their activation peak",
    )
    parser.add_argument(
        "--no-reserve",
        action="store_true",
        help="keep nothing free for the KV cache and activations (infer_auto_device_map's plan)",
    )
    parser.add_argument(
        "--context",
        type=int,
        help="tokens the KV cache holds (default: the model's max_position_embeddings, at "
        "most --context-cap)",
    )
    parser.add_argument(
        "--context-cap",
        type=int,
        help="cap on the model's maximum context when --context is not given (default 32768)",
    )
    parser.add_argument("--batch", type=int, help="sequences generated together (default 1)")
    parser.add_argument(
        "--kv-dtype",
        choices=KV_DTYPES,
        help="KV cache dtype (default 'model': the weights' dtype)",
    )
    parser.add_argument(
        "--kv-engine",
        choices=KV_ENGINES,
        help="whose MLA cache layout to count (default transformers)",
    )
    parser.add_argument(
        "--prefill-tokens",
        type=int,
        metavar="N",
        help="tokens one prefill forward processes, which sets the activation reserve: an "
        "engine's chunk size (vLLM, llama.cpp: 512-8192); default: the whole context",
    )
    parser.add_argument("--profile", help="hardware profile (see `workbench profiles`)")
    parser.add_argument("--dtype", help="dtype the weights will be loaded in (default: as stored)")
    parser.add_argument("-o", "--output", help="write the device map here (JSON)")
    parser.add_argument("--emit-code", action="store_true", help="print the from_pretrained call")
    parser.add_argument(
        "--no-prefetch", action="store_true", help="predict without copy/compute overlap"
    )
    parser.add_argument(
        "--prompt-tokens", type=int, default=128, help="prompt length for TTFT (default 128)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    add_precision_arguments(parser)
    parser.set_defaults(func=run)


def parse_device_sizes(items: list[str], option: str) -> dict[int | str, int]:
    """``["0=24GiB", "cpu=64GiB"]`` -> ``{0: 25769803776, "cpu": 68719476736}``.

    Raises:
        BadInputError: an item without ``=``, a device twice, a bad device or size.
    """
    from workbench.runtime import convert_file_size_to_int, normalize_device  # noqa: PLC0415 (torch: not at CLI start)

    sizes: dict[int | str, int] = {}
    for item in items:
        device_text, sep, size_text = item.partition("=")
        if not sep or not device_text or not size_text:
            raise BadInputError(
                f"{option} item {item!r} must look like DEVICE=SIZE, e.g. 0=24GiB cpu=64GiB disk=1TiB"
            )
        try:
            device = normalize_device(device_text)
            nbytes = convert_file_size_to_int(size_text)
        except BadInputError as exc:
            raise BadInputError(f"{option} item {item!r}: {exc}") from None
        if device in sizes:
            raise BadInputError(
                f"{option} gives device {device_text!r} twice; give each device once"
            )
        sizes[device] = nbytes
    return sizes


def run(args: argparse.Namespace) -> int:
    from workbench.models.hardware import (  # noqa: PLC0415 (torch: not at CLI start)
        detect_hardware,
        load_profile,
        profile_for_budgets,
    )
    from workbench.runtime import save_device_map  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.machine_attention import predict_with_attention  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.planning import (  # noqa: PLC0415 (torch: not at CLI start)
        AttentionKindWarning,
        attention_layout,
        plan_opened_model,
    )
    from workbench.runtime.precision_planning import PrecisionPlanning  # noqa: PLC0415 (torch: not at CLI start)

    if args.prompt_tokens < 1:
        raise BadInputError(f"--prompt-tokens must be at least 1, got {args.prompt_tokens}")
    max_memory = parse_device_sizes(args.max_memory, "--max-memory")
    profile = load_profile(args.profile) if args.profile else None
    if profile is not None:
        budgets = {**profile.budgets(), **max_memory}
    elif max_memory:
        budgets = dict(max_memory)
    else:
        profile = detect_hardware(measure_host_probes=True)  # the host probes, once per machine
        budgets = profile.budgets()
    memory, asked = _memory_options(args)
    opened = open_with_progress(args.source, dtype=args.dtype, quiet=args.json)
    reserve = {} if memory is not None else parse_device_sizes(args.reserve, "--reserve")
    unread: list[str] = []
    if memory is not None and not asked:
        try:  # the default reserve: as the planner panel, none for a config it cannot read
            attention_layout(opened)
        except (ValueError, TypeError, AttributeError) as exc:
            memory = None
            unread.append(f"no memory model for {opened.label} ({exc}); planned without a reserve")
    with stage_progress(1, quiet=args.json, desc="planning") as bar:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", AttentionKindWarning)
            plan = plan_opened_model(
                opened, max_memory=budgets, strategy=args.strategy, reserve=reserve, memory=memory
            )
        bar.update(1)
    noted = unread + list(dict.fromkeys(str(w.message) for w in caught))
    reserve = dict(plan.reserve) if memory is not None else reserve
    speed_profile = profile_for_budgets(budgets, base=profile)
    joint = plan_precisions(args, opened, budgets, reserve, speed_profile)
    if isinstance(joint, PrecisionPlanning) and memory is not None:
        joint, reserve, why = settle_joint_reserves(
            args, opened, budgets, speed_profile, memory, joint
        )
        plan = dataclasses.replace(plan, reserve=reserve, reserve_why=why)
    plan = as_plan_result(plan, joint) if joint else plan
    if args.output:
        save_device_map(args.output, plan.device_map)
    prediction = predict_with_attention(  # this CPU's timed attention, as the window counts it
        opened,
        opened.tree,
        plan.device_map,
        speed_profile,
        prefetch=not args.no_prefetch,
        prompt_tokens=args.prompt_tokens,
    )
    code = (
        emit_code(opened, plan.device_map, budgets, source=args.source) if args.emit_code else None
    )
    if joint:
        prediction = joint.prediction
        code = precision_code(opened, joint, budgets, source=args.source) if code else None
    if args.json:
        document = _plan_document(
            args, opened, plan, budgets, reserve, prediction, speed_profile, code
        )
        document["memory"] = _memory_document(opened, memory)
        document["warnings"] = noted
        document["quantization"] = precision_document(joint) if joint else None
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    sized_at = sizes_words(opened, joint) if joint else None
    for line in plan_lines(opened, plan, budgets, reserve, args.strategy, sized_at=sized_at):
        print(line)
    for line in precision_lines(joint) if joint else []:
        print(line)
    for why in plan.reserve_why.values():
        print(f"why        {why}")
    for text in noted:
        print(f"warning    {text}")
    if args.output:
        print(f"wrote      {args.output}")
    speed = prediction.summary(generates=generates_tokens(opened))
    print(f"predicted  {speed} on {speed_profile.name}")
    if code:
        print()
        print(code, end="")
    return 0


def _memory_options(args: argparse.Namespace) -> tuple[Any, bool]:
    """The memory model's ``MemoryOptions`` (the GUI's defaults, changed by the memory flags),
    or ``None`` with ``--reserve DEVICE=SIZE`` or ``--no-reserve``; and whether a flag asked
    for the memory model (``--reserve auto`` or a memory flag).

    Raises:
        BadInputError: ``--reserve auto`` mixed with sizes, memory flags with sizes or with
            ``--no-reserve``, or a non-positive figure.
    """
    from workbench.runtime.planning import MemoryOptions  # noqa: PLC0415 (torch: not at CLI start)

    flags = {
        "--context": args.context,
        "--batch": args.batch,
        "--kv-dtype": args.kv_dtype,
        "--kv-engine": args.kv_engine,
        "--context-cap": args.context_cap,
        "--prefill-tokens": args.prefill_tokens,
    }
    given = [flag for flag, value in flags.items() if value is not None]
    auto = "auto" in args.reserve
    if auto and args.reserve != ["auto"]:
        raise BadInputError("--reserve takes 'auto' or DEVICE=SIZE items, not both")
    if args.no_reserve and (given or args.reserve):
        named = ", ".join([*given, "--reserve"] if args.reserve else given)
        raise BadInputError(f"--no-reserve plans without a reserve; drop it or {named}")
    if args.reserve and not auto:
        if given:
            raise BadInputError(
                f"{', '.join(given)} plan the reserve with the memory model; drop --reserve "
                "DEVICE=SIZE or those flags"
            )
        return None, False
    if args.no_reserve:
        return None, False
    options = MemoryOptions(
        batch=1 if args.batch is None else args.batch,
        context=args.context,
        kv_dtype=args.kv_dtype or "model",
        engine=args.kv_engine or "transformers",
        context_cap=DEFAULT_CONTEXT_CAP if args.context_cap is None else args.context_cap,
        prefill_tokens=args.prefill_tokens,
    )
    return options, auto or bool(given)


def _memory_document(opened: Any, memory: Any) -> dict[str, Any] | None:
    """What the memory model planned for (``None`` without it), with the resolved context."""
    from workbench.runtime.planning import (  # noqa: PLC0415 (torch: not at CLI start)
        planned_context,
        planned_prefill,
    )

    if memory is None:
        return None
    return {
        "batch": memory.batch,
        "context": planned_context(opened, memory),
        "context_cap": memory.context_cap,
        "kv_dtype": memory.kv_dtype,
        "engine": memory.engine,
        "prefill_tokens": planned_prefill(opened, memory),
    }


def plan_lines(
    opened: Any,
    plan: Any,
    budgets: dict[int | str, int],
    reserve: dict[int | str, int],
    strategy: str,
    sized_at: str | None = None,
) -> list[str]:
    """Per-device totals: used / budget, the modules placed, reserve. ``sized_at`` says what the
    bytes are counted at when not the model's dtype (``plan_precisions.sizes_words``)."""
    from workbench.runtime import (  # noqa: PLC0415 (torch: not at CLI start)
        device_label,
        device_sort_key,
        dtype_name,
        format_nbytes,
    )
    from workbench.runtime.planning import planning_dtype  # noqa: PLC0415 (torch: not at CLI start)

    total = sum(plan.per_device_bytes.values())
    lines = [
        f"plan       {opened.label}: {format_nbytes(total)} ({sized_at or dtype_name(planning_dtype(opened))}), "
        f"strategy {strategy}, {len(plan.device_map)} map entries"
    ]
    by_device: dict[int | str, list[str]] = {}
    for name, device in plan.device_map.items():
        by_device.setdefault(device, []).append(name or "(whole model)")
    devices = sorted(set(budgets) | set(plan.per_device_bytes), key=device_sort_key)
    for device in devices:
        used = plan.per_device_bytes.get(device, 0)
        budget = budgets.get(device)
        share = f" / {format_nbytes(budget)} ({100 * used / budget:.0f}%)" if budget else ""
        extra = f", reserve {format_nbytes(reserve[device])}" if reserve.get(device) else ""
        modules = compress_names(by_device.get(device, []))
        lines.append(f"{device_label(device):<10} {format_nbytes(used)}{share}{extra}")
        if modules:
            lines.append(f"           {modules}")
    return lines


def compress_names(names: list[str], limit: int = 6) -> str:
    """``["model.layers.0", "model.layers.1", "lm_head"]`` -> ``"model.layers.0-1, lm_head"``."""
    from workbench.runtime.map_edits import compact_names  # noqa: PLC0415 (torch: not at CLI start)

    parts = compact_names(names)
    if len(parts) > limit:
        parts = [*parts[:limit], f"... ({len(parts) - limit} more)"]
    return ", ".join(parts)


def emit_code(
    opened: Any, device_map: dict[str, Any], budgets: dict[int | str, int], *, source: str
) -> str:
    """The ``from_pretrained`` call that loads the model with this map and these budgets
    (the runtime's writer, as the GUI's "Copy as code")."""
    from workbench.runtime.map_code import (  # noqa: PLC0415 (torch: not at CLI start)
        checkpoint_location,
        from_pretrained_code,
    )
    from workbench.runtime.planning import planning_dtype  # noqa: PLC0415 (torch: not at CLI start)

    location, placeholder = checkpoint_location(source, opened.folder)
    return from_pretrained_code(
        model_class=opened.model_class,
        location=location,
        placeholder=placeholder,
        device_map=device_map,
        max_memory=budgets,
        dtype=planning_dtype(opened),
    )


def _plan_document(
    args: argparse.Namespace,
    opened: Any,
    plan: Any,
    budgets: dict[int | str, int],
    reserve: dict[int | str, int],
    prediction: Any,
    profile: Any,
    code: str | None,
) -> dict[str, Any]:
    from workbench.runtime import dtype_name  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.planning import planning_dtype  # noqa: PLC0415 (torch: not at CLI start)

    return {
        "source": args.source,
        "model_class": opened.model_class,
        "strategy": args.strategy,
        "dtype": dtype_name(planning_dtype(opened)),
        "budgets": {str(device): nbytes for device, nbytes in budgets.items()},
        "reserve": {str(device): nbytes for device, nbytes in reserve.items()},
        "reserve_why": {str(device): why for device, why in plan.reserve_why.items()},
        "device_map": plan.device_map,
        "per_device_bytes": {
            str(device): nbytes for device, nbytes in plan.per_device_bytes.items()
        },
        "output": args.output,
        "profile": profile.name,
        "speed": prediction.to_dict(),
        "generates_tokens": generates_tokens(opened),  # False: the speed is speed.prefill_s
        "code": code,
    }
