"""``workbench inspect SOURCE``: the module tree of a model with parameter counts and sizes.

SOURCE is a ``config.json``, a model folder, ``hf-cache:org/name`` or a bundled config name
(``llama-3.1-70b``; ``workbench inspect --list`` shows them, with the cached models).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any

from tqdm import tqdm

from workbench.models.catalog import list_bundled_configs
from workbench.models.hf_cache import list_cached_models
from workbench.runtime import BadInputError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show a model's module tree with sizes",
        description="Open a model (config.json, folder, hf-cache:REPO or bundled name) with "
        "empty weights and print its module tree with parameter counts and bytes.",
    )
    parser.add_argument(
        "source", nargs="?", help="config.json, model folder, hf-cache:REPO, or bundled name"
    )
    parser.add_argument("--dtype", help="count floating weights in this dtype (default: as stored)")
    parser.add_argument("--depth", type=int, default=2, help="tree levels to show (default 2)")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument(
        "--list", action="store_true", help="list bundled configs and cached models, then exit"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.list:
        return _list_sources(args)
    if not args.source:
        raise BadInputError("inspect needs a SOURCE (or --list to see what is available)")
    if args.depth < 0:
        raise BadInputError(f"--depth must be 0 or more, got {args.depth}")
    opened = open_with_progress(args.source, dtype=args.dtype, quiet=args.json)
    if args.json:
        json.dump(describe_model(opened, depth=args.depth), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for line in summary_lines(opened):
        print(line)
    print()
    for line in tree_lines(opened.tree.root, depth=args.depth):
        print(line)
    return 0


@contextlib.contextmanager
def stage_progress(total: int, *, quiet: bool, desc: str) -> Iterator[Any]:
    """A tqdm bar on stderr over named stages; silent when ``quiet`` or stderr is no TTY."""
    disable = quiet or not sys.stderr.isatty()
    with tqdm(total=total, desc=desc, file=sys.stderr, disable=disable, leave=False) as bar:
        yield bar


def open_with_progress(source: str, *, dtype: str | None, quiet: bool) -> Any:
    """``open_model`` with a progress bar over its stages (config, build, headers, tree)."""
    from workbench.models.intake import OPEN_STAGES, open_model  # noqa: PLC0415 (torch: not at CLI start)

    with stage_progress(len(OPEN_STAGES), quiet=quiet, desc=f"opening {source}") as bar:

        def on_stage(stage: str) -> None:
            bar.update(OPEN_STAGES.index(stage) - bar.n)
            bar.set_description_str(f"opening {source}: {stage}")

        opened = open_model(source, dtype=dtype, progress=on_stage)
        bar.update(bar.total - bar.n)
    return opened


def describe_model(opened: Any, *, depth: int | None) -> dict[str, Any]:
    """The JSON document of ``inspect --json``."""
    from workbench.models.tree import tree_to_dict  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime import dtype_name  # noqa: PLC0415 (torch: not at CLI start)

    checkpoint = None
    if opened.checkpoint is not None:
        checkpoint = {
            "files": [str(path) for path in opened.checkpoint.files],
            "tensors": len(opened.checkpoint),
            "nbytes": opened.checkpoint.total_nbytes,
            "dtypes": {dtype_name(d): n for d, n in opened.checkpoint.dtype_nbytes().items()},
            "missing_keys": opened.missing_keys,
            "unexpected_keys": opened.unexpected_keys,
        }
    root = opened.tree.root
    return {
        "source": opened.source,
        "config_path": str(opened.config_path),
        "model_class": opened.model_class,
        "model_type": getattr(opened.config, "model_type", ""),
        "declared_dtype": dtype_name(opened.declared_dtype) if opened.declared_dtype else None,
        "planning_dtype": dtype_name(opened.planning_dtype),
        "params": root.param_count,
        "nbytes": root.nbytes,
        "stored_nbytes": root.stored_nbytes,
        "modules": len(opened.tree),
        "no_split_modules": opened.no_split_modules,
        "tied_groups": opened.tied_groups,
        "checkpoint": checkpoint,
        "tokenizer_dir": str(opened.tokenizer_dir) if opened.tokenizer_dir else None,
        "tree": tree_to_dict(root, max_depth=depth),
    }


def summary_lines(opened: Any) -> list[str]:
    """The header of ``inspect``: class, counts, sizes, dtypes, no-split and tied weights."""
    from workbench.runtime import dtype_name, format_nbytes, format_param_count  # noqa: PLC0415 (torch: not at CLI start)

    root = opened.tree.root
    lines = [
        f"model      {opened.model_class} ({getattr(opened.config, 'model_type', '?')}) from {opened.source}",
        f"params     {format_param_count(root.param_count)} in {len(opened.tree)} modules",
        f"size       {format_nbytes(root.nbytes)} for planning ({dtype_name(opened.planning_dtype)}), "
        f"{format_nbytes(root.stored_nbytes)} as stored",
        f"dtype      declared {dtype_name(opened.declared_dtype) if opened.declared_dtype else 'none'}",
        f"no-split   {', '.join(opened.no_split_modules) or 'none'}",
        f"tied       {'; '.join(' = '.join(group) for group in opened.tied_groups) or 'none'}",
    ]
    if opened.checkpoint is not None:
        dtypes = ", ".join(
            f"{dtype_name(d)} {format_nbytes(n)}"
            for d, n in opened.checkpoint.dtype_nbytes().items()
        )
        lines.append(
            f"weights    {len(opened.checkpoint)} tensors in {len(opened.checkpoint.files)} files ({dtypes})"
        )
        if opened.missing_keys or opened.unexpected_keys:
            lines.append(
                f"mismatch   {len(opened.missing_keys)} tensors missing from the checkpoint, "
                f"{len(opened.unexpected_keys)} not in the model"
            )
    else:
        lines.append("weights    none (sizes from the config)")
    if opened.tokenizer_dir is not None:
        lines.append(f"tokenizer  {opened.tokenizer_dir}")
    return lines


def tree_lines(root: Any, *, depth: int) -> list[str]:
    """Indented rows ``name  class  params  size  [no-split] [tied]`` down to ``depth``."""
    from workbench.runtime import format_nbytes, format_param_count  # noqa: PLC0415 (torch: not at CLI start)

    rows: list[tuple[str, str, str, str, str]] = []
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        node, level = stack.pop()
        flags = " ".join(
            flag for flag, on in (("[no-split]", node.no_split), ("[tied]", node.tied)) if on
        )
        label = "  " * level + (node.short_name or "(model)")
        rows.append(
            (
                label,
                node.class_name,
                format_param_count(node.param_count),
                format_nbytes(node.nbytes),
                flags,
            )
        )
        if level < depth:
            stack.extend((child, level + 1) for child in reversed(node.children))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    header = ("module", "class", "params", "size", "")
    lines = [_format_row(header, widths)]
    lines += [_format_row(row, widths) for row in rows]
    return lines


def _format_row(row: tuple[str, ...], widths: list[int]) -> str:
    name, cls, params, size, flags = row
    text = (
        f"{name:<{max(widths[0], 6)}}  {cls:<{max(widths[1], 5)}}  "
        f"{params:>{max(widths[2], 6)}}  {size:>{max(widths[3], 4)}}  {flags}"
    )
    return text.rstrip()


def _list_sources(args: argparse.Namespace) -> int:
    from workbench.runtime import format_nbytes  # noqa: PLC0415 (torch: not at CLI start)

    bundled = list_bundled_configs()
    cached = list_cached_models()
    if args.json:
        data = {
            "bundled": [
                {"name": e.name, "model_type": e.model_type, "path": str(e.path)} for e in bundled
            ],
            "cached": [
                {"repo_id": m.repo_id, "path": str(m.snapshot_path), "has_weights": m.has_weights}
                for m in cached
            ],
        }
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print("bundled configs (open by name):")
    for entry in bundled:
        print(f"  {entry.name:<22} {entry.architecture}")
    print("cached models (open as hf-cache:REPO):")
    for model in cached:
        weights = "weights" if model.has_weights else "config only"
        print(f"  {model.repo_id:<40} {format_nbytes(model.size_on_disk):>10}  {weights}")
    if not cached:
        print("  none")
    return 0
