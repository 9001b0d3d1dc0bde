"""``workbench plan SOURCE``: infer a device map for budgets, write it, predict the speed.

Budgets come from ``--max-memory 0=24GiB cpu=64GiB disk=1TiB``, from ``--profile NAME`` (a
what-if machine; ``--max-memory`` entries override it), or, with neither, from this machine's
free memory. ``--emit-code`` prints the equivalent ``from_pretrained`` call.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


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
        help="memory kept free for activations, e.g. 0=2GiB; 'auto' estimates it from the "
        "config for each GPU (or the CPU without GPUs) for a --prompt-tokens prefill",
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
    parser.set_defaults(func=run)


def parse_device_sizes(items: list[str], option: str) -> dict[int | str, int]:
    """``["0=24GiB", "cpu=64GiB"]`` -> ``{0: 25769803776, "cpu": 68719476736}``.

    Raises:
        BadInputError: an item without ``=``, a device twice, a bad device or size.
    """
    from workbench.big_modeling.devices import normalize_device
    from workbench.big_modeling.errors import BadInputError
    from workbench.big_modeling.sizes import convert_file_size_to_int

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
    from workbench.big_modeling.errors import BadInputError
    from workbench.commands.inspect import open_with_progress, stage_progress
    from workbench.models.hardware import detect_hardware, load_profile, profile_for_budgets
    from workbench.models.speed import predict_speed

    if args.prompt_tokens < 1:
        raise BadInputError(f"--prompt-tokens must be at least 1, got {args.prompt_tokens}")
    max_memory = parse_device_sizes(args.max_memory, "--max-memory")
    profile = load_profile(args.profile) if args.profile else None
    if profile is not None:
        budgets = {**profile.budgets(), **max_memory}
    elif max_memory:
        budgets = dict(max_memory)
    else:
        profile = detect_hardware()
        budgets = profile.budgets()
    opened = open_with_progress(args.source, dtype=args.dtype, quiet=args.json)
    reserve = _reserve(args.reserve, opened, budgets, args.prompt_tokens)
    with stage_progress(1, quiet=args.json, desc="planning") as bar:
        plan = plan_with_tree_sizes(
            opened, max_memory=budgets, strategy=args.strategy, reserve=reserve or None
        )
        bar.update(1)
    if args.output:
        from workbench.big_modeling.device_map import save_device_map

        save_device_map(args.output, plan.device_map)
    speed_profile = profile_for_budgets(budgets, base=profile)
    prediction = predict_speed(
        opened,
        plan.device_map,
        speed_profile,
        prefetch=not args.no_prefetch,
        prompt_tokens=args.prompt_tokens,
    )
    code = (
        emit_code(opened, plan.device_map, budgets, source=args.source) if args.emit_code else None
    )
    if args.json:
        json.dump(
            _plan_document(args, opened, plan, budgets, reserve, prediction, speed_profile, code),
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
        return 0
    for line in plan_lines(opened, plan, budgets, reserve, args.strategy):
        print(line)
    if args.output:
        print(f"wrote      {args.output}")
    print(f"predicted  {prediction.summary()} on {speed_profile.name}")
    if code:
        print()
        print(code)
    return 0


def plan_with_tree_sizes(
    opened: Any,
    *,
    max_memory: dict[int | str, int],
    strategy: str,
    reserve: dict[int | str, int] | None,
) -> Any:
    """``plan_device_map`` for ``opened`` with the sizes its tree reports
    (``opened.module_sizes()``: checkpoint headers when there are weights), so the plan's
    totals and the tree agree even for a checkpoint mixing dtypes."""

    from workbench.big_modeling.planner import plan_device_map

    return plan_device_map(
        opened.model,
        max_memory=max_memory,
        strategy=strategy,
        no_split_module_classes=opened.no_split_modules,
        dtype=_planner_dtype(opened),
        reserve=reserve,
        # A what-if config has no stored sizes: the planner's lazy index is faster there.
        module_sizes=opened.module_sizes() if opened.has_weights else None,
    )


def _planning_dtype(opened: Any) -> Any:
    """The dtype weights are planned in: ``--dtype``, else the checkpoint's one floating dtype,
    else the declared one."""
    if opened.planning_dtype is not None:
        return opened.planning_dtype
    if opened.checkpoint is None:
        return opened.declared_dtype
    stored = list(opened.checkpoint.dtype_nbytes())
    floating = [dtype for dtype in stored if dtype.is_floating_point]
    return floating[0] if len(floating) == 1 else None


def _planner_dtype(opened: Any) -> Any:
    """The ``dtype=`` for the planner: ``None`` when the meta model already has the stored
    dtype, so buffers keep their own size, as the tree counts them."""
    dtype = _planning_dtype(opened)
    if opened.planning_dtype is None:
        param = next(opened.model.parameters(), None)
        if param is not None and param.dtype == dtype:
            return None
    return dtype


def _reserve(
    items: list[str], opened: Any, budgets: dict[int | str, int], prompt_tokens: int
) -> dict[int | str, int]:
    from workbench.big_modeling.errors import BadInputError

    if items == ["auto"]:
        try:
            from workbench.big_modeling.reserve import estimate_activation_reserve
        except ImportError as exc:  # the estimator ships with the engine
            raise BadInputError(
                "--reserve auto is not available in this build; give DEVICE=SIZE"
            ) from exc
        dtype = _planning_dtype(opened)
        nbytes = estimate_activation_reserve(opened.config, 1, prompt_tokens, dtype)
        gpus = [device for device in budgets if isinstance(device, int)]
        return {device: int(nbytes) for device in gpus or ["cpu"]}
    return parse_device_sizes(items, "--reserve")


def plan_lines(
    opened: Any,
    plan: Any,
    budgets: dict[int | str, int],
    reserve: dict[int | str, int],
    strategy: str,
) -> list[str]:
    """Per-device totals: used / budget, the modules placed, reserve."""
    from workbench.big_modeling.devices import device_label, device_sort_key
    from workbench.big_modeling.sizes import format_nbytes
    from workbench.models.dtypes import dtype_name

    total = sum(plan.per_device_bytes.values())
    lines = [
        f"plan       {opened.label}: {format_nbytes(total)} ({dtype_name(_planning_dtype(opened))}), "
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
    runs: list[list[Any]] = []  # [prefix, first, last] or [name]
    for name in names:
        match = re.fullmatch(r"(.*\.)(\d+)", name)
        if (
            match
            and runs
            and len(runs[-1]) == 3
            and runs[-1][0] == match.group(1)
            and runs[-1][2] + 1 == int(match.group(2))
        ):
            runs[-1][2] = int(match.group(2))
        elif match:
            runs.append([match.group(1), int(match.group(2)), int(match.group(2))])
        else:
            runs.append([name])
    parts = [
        run[0]
        if len(run) == 1
        else f"{run[0]}{run[1]}" + (f"-{run[2]}" if run[2] != run[1] else "")
        for run in runs
    ]
    if len(parts) > limit:
        parts = [*parts[:limit], f"... ({len(parts) - limit} more)"]
    return ", ".join(parts)


def format_budget(nbytes: int) -> str | int:
    """A budget ``from_pretrained(max_memory=...)`` parses back to the same bytes: ``"24GiB"``,
    ``"2000GB"``, else the int. accelerate reads only GiB/MiB/KiB/GB/MB/KB (no TiB/TB) and
    rejects a bare digit string."""
    units = (("GiB", 2**30), ("GB", 10**9), ("MiB", 2**20), ("MB", 10**6))
    for unit, factor in units:
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor}{unit}"
    return int(nbytes)


def emit_code(
    opened: Any, device_map: dict[str, Any], budgets: dict[int | str, int], *, source: str
) -> str:
    """The ``from_pretrained`` call that loads the model with this map and these budgets."""
    from workbench.models.catalog import hub_repo_id
    from workbench.models.dtypes import dtype_name
    from workbench.models.hf_cache import HF_CACHE_PREFIX

    if opened.folder is not None and not source.startswith(HF_CACHE_PREFIX):
        location = repr(os.fspath(opened.folder))
    else:  # a bare config.json without a Hub id: point at its weights
        location = repr(hub_repo_id(source) or "path/to/checkpoint")
    map_lines = "\n".join(f"    {name!r}: {device!r}," for name, device in device_map.items())
    memory = ", ".join(
        f"{device!r}: {format_budget(nbytes)!r}" for device, nbytes in budgets.items()
    )
    dtype = _planning_dtype(opened)
    lines = [
        "import torch",
        f"from transformers import {opened.model_class}",
        "",
        "device_map = {",
        map_lines,
        "}",
        f"model = {opened.model_class}.from_pretrained(",
        f"    {location},",
        "    device_map=device_map,",
        f"    max_memory={{{memory}}},",
    ]
    if "disk" in device_map.values():
        lines.append('    offload_folder="offload",')
    if dtype is not None:
        lines.append(f"    dtype=torch.{dtype_name(dtype)},")
    lines.append(")")
    return "\n".join(lines)


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
    from workbench.models.dtypes import dtype_name

    return {
        "source": args.source,
        "model_class": opened.model_class,
        "strategy": args.strategy,
        "dtype": dtype_name(_planning_dtype(opened)),
        "budgets": {str(device): nbytes for device, nbytes in budgets.items()},
        "reserve": {str(device): nbytes for device, nbytes in reserve.items()},
        "device_map": plan.device_map,
        "per_device_bytes": {
            str(device): nbytes for device, nbytes in plan.per_device_bytes.items()
        },
        "output": args.output,
        "profile": profile.name,
        "speed": prediction.to_dict(),
        "code": code,
    }
