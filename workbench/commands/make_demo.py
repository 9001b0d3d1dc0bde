"""``workbench make-demo DIR``: write a demo checkpoint (config, sharded safetensors, tokenizer)."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from workbench.commands.inspect import stage_progress


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "make-demo",
        help="write a small demo model folder (Hugging Face format)",
        description="Write a Hugging Face-format demo model: config.json, sharded safetensors "
        "with an index, and a tokenizer made offline. The same arguments give the same bytes.",
    )
    parser.add_argument("folder", help="folder to create (must not exist or be empty)")
    parser.add_argument("--arch", default="llama", help="llama, gpt2 or bert (default llama)")
    parser.add_argument("--params", default="60M", help="approximate parameter count (default 60M)")
    parser.add_argument(
        "--shards", type=int, default=4, help="number of safetensors files (default 4)"
    )
    parser.add_argument("--dtype", default="float16", help="stored dtype (default float16)")
    parser.add_argument(
        "--seed", type=int, default=0, help="random seed for the weights (default 0)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workbench.models.demo import DEMO_STAGES, make_demo  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.models.intake import open_model  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime import ShardProgress, format_nbytes, format_param_count  # noqa: PLC0415 (torch: not at CLI start)

    stages = (*DEMO_STAGES, "opening the demo")
    with (
        stage_progress(len(stages), quiet=args.json, desc=f"making {args.arch} demo") as bar,
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")

        def on_stage(stage: str) -> None:
            bar.update(stages.index(stage) - bar.n)
            bar.set_description_str(f"making {args.arch} demo: {stage}")

        def on_shard(report: ShardProgress) -> None:
            bar.set_description_str(f"making {args.arch} demo: {report.describe()}")

        folder = make_demo(
            args.folder,
            arch=args.arch,
            params=args.params,
            shards=args.shards,
            dtype=args.dtype,
            seed=args.seed,
            overwrite=args.overwrite,
            progress=on_stage,
            shard_progress=on_shard,
        )
        on_stage(stages[-1])
        opened = open_model(folder)
        bar.update(bar.total - bar.n)
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    root = opened.tree.root
    files = sorted(path.name for path in folder.iterdir())
    if args.json:
        data = {
            "folder": str(folder),
            "arch": args.arch,
            "model_class": opened.model_class,
            "params": root.param_count,
            "stored_nbytes": root.stored_nbytes,
            "shards": len(opened.checkpoint.files) if opened.checkpoint else 0,
            "files": files,
        }
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(
        f"wrote {opened.model_class} demo to {folder}: {format_param_count(root.param_count)} params, "
        f"{format_nbytes(root.stored_nbytes)} in {len(opened.checkpoint.files) if opened.checkpoint else 0} "
        f"shard(s), seed {args.seed}"
    )
    print(f"files: {', '.join(files)}")
    print(f"next:  workbench inspect {folder}   |   workbench --open {folder}")
    return 0
