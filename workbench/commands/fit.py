"""``workbench fit MODEL``: what fits where, every hardware profile by context length.

The table of the GUI's Tools > What fits where: per profile (bundled and the user's, or the
ones named with ``--profile``) and context (4k, 32k, 128k and the model's maximum, or
``--context``), whether the model runs on the GPUs, partly offloaded, on the CPU only or not at
all, with the predicted decode tokens/s and time to first token
(``workbench.runtime.fit_table``). ``--prefill-tokens N`` sizes the activation reserve for an
engine that prefills in chunks of N tokens (the default is one prefill of the whole context).
``--json`` prints the same table for scripts.

Torch comes in only when the command runs: the CLI imports this module to build its parser.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from workbench.commands.inspect import open_with_progress, stage_progress
from workbench.runtime import BadInputError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "fit",
        help="what fits where: every hardware profile by context length",
        description="For every hardware profile (bundled and yours) and context length (4k, "
        "32k, 128k and the model's maximum), say whether the model runs fully on GPU, "
        "partly offloaded, on the CPU only or not at all, with predicted tok/s and TTFT.",
    )
    parser.add_argument("source", help="config.json, model folder, hf-cache:REPO, or bundled name")
    parser.add_argument(
        "--profile",
        nargs="+",
        metavar="NAME",
        help="only these profiles (names, 'detected' or .json paths; default: every one)",
    )
    parser.add_argument(
        "--context",
        nargs="+",
        type=int,
        metavar="TOKENS",
        help="these context lengths instead of 4k 32k 128k and the model's maximum",
    )
    parser.add_argument(
        "--prefill-tokens",
        type=int,
        metavar="N",
        help="plan the activation reserve for prefill chunks of N tokens (engines with chunked "
        "prefill: vLLM, llama.cpp); default: a prefill of the whole context",
    )
    parser.add_argument("--dtype", help="dtype the weights will be loaded in (default: as stored)")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workbench.models.hardware import list_profiles, load_profile  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.fit_table import fit_contexts, fit_table  # noqa: PLC0415 (torch: not at CLI start)

    if args.context and min(args.context) < 1:
        raise BadInputError(f"--context must be at least 1 token, got {min(args.context)}")
    if args.prefill_tokens is not None and args.prefill_tokens < 1:
        raise BadInputError(f"--prefill-tokens must be at least 1, got {args.prefill_tokens}")
    profiles = [load_profile(name) for name in args.profile] if args.profile else list_profiles()
    opened = open_with_progress(args.source, dtype=args.dtype, quiet=args.json)
    contexts = args.context or fit_contexts(opened)
    with stage_progress(len(profiles) * len(contexts), quiet=args.json, desc="fitting") as bar:
        table = fit_table(
            opened,
            profiles,
            contexts,
            on_cell=lambda _cell: bar.update(1),
            prefill_tokens=args.prefill_tokens,
        )
    if args.json:
        json.dump({"source": args.source, **table.to_dict()}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for line in fit_lines(table):
        print(line)
    return 0


def fit_lines(table: Any) -> list[str]:
    """The table as text: a title, then per profile its budgets and one line per context,
    followed by that cell's notes (the planner's warnings, an estimated attention)."""
    from workbench.runtime.fit_table import context_label  # noqa: PLC0415 (torch: not at CLI start)

    contexts = " ".join(context_label(c) for c in table.contexts)
    count = len(table.profiles)
    rows = f"{count} profile{'' if count == 1 else 's'}"
    chunks = table.prefill_tokens
    prefill = "" if chunks is None else f", prefill in {context_label(chunks)}-token chunks"
    lines = [f"fit        {table.model}: {rows} x contexts {contexts}{prefill}"]
    lines.extend(f"warning    {message}" for message in table.warnings)
    for profile in table.profiles:
        lines.append(f"{profile.name:<22} {profile.budget_description()}")
        for context in table.contexts:
            cell = table.cell(profile.name, context)
            detail = cell.speed_text() or cell.problem
            lines.append(f"    {context_label(context):>6}  {cell.label():<44} {detail}")
            if cell.fits and cell.problem:
                lines.append(f"            ({cell.problem})")
            lines.extend(f"            note: {note}" for note in cell.notes)
    return lines
