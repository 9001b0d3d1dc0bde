"""``workbench cluster-plan SOURCE --cluster PROFILE --engine vllm|sglang|llama.cpp``: plan a
model across nodes (tensor parallel inside a node, pipeline stages across), compare the
candidates, print the launch lines, and with ``--export DIR`` write one script per node and a
README of the plan.
"""

from __future__ import annotations

import argparse
import json
import sys

from workbench.commands.inspect import open_with_progress
from workbench.models.catalog import hub_repo_id
from workbench.runtime import BadInputError

CLI_ENGINES = ("vllm", "sglang", "llama.cpp")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "cluster-plan",
        help="plan a model across a cluster and export engine launch scripts",
        description="Choose tensor-parallel and pipeline-parallel sizes and the layer partition "
        "for a model on a cluster profile (see resources/clusters or "
        "$XDG_CONFIG_HOME/model-memory-workbench/clusters), predict memory per GPU and speed, "
        "and print the engine's launch command per node.",
    )
    parser.add_argument("source", help="config.json, model folder, hf-cache:REPO, or bundled name")
    parser.add_argument("--cluster", required=True, help="cluster profile name or .json path")
    parser.add_argument("--engine", default="vllm", choices=CLI_ENGINES)
    parser.add_argument("--dtype", help="dtype the weights are served in (default: as declared)")
    parser.add_argument(
        "--context", type=int, help="tokens per sequence (default: the model's maximum)"
    )
    parser.add_argument("--batch", type=int, default=1, help="concurrent sequences (default 1)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"))
    parser.add_argument(
        "--model-ref", help="model id or path in the launch lines (default: the Hub id)"
    )
    parser.add_argument("--candidates", type=int, default=6, help="candidates to list (default 6)")
    parser.add_argument("--export", metavar="DIR", help="write one script per node and README.md")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workbench.models.cluster import load_cluster  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.cluster_layout import ModelLayout  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.cluster_plan import GIB, plan_cluster  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.engine_export import export_launch_scripts, node_scripts  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.formatting import format_nbytes, format_rate  # noqa: PLC0415 (torch: not at CLI start)

    if args.batch < 1 or (args.context is not None and args.context < 1):
        raise BadInputError("--batch and --context must be at least 1")
    cluster = load_cluster(args.cluster)
    opened = open_with_progress(args.source, dtype=args.dtype, quiet=args.json)
    layout = ModelLayout.from_opened(opened)
    plan = plan_cluster(
        layout,
        cluster,
        engine=args.engine,
        context_tokens=args.context,
        batch_size=args.batch,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    model_ref = args.model_ref or hub_repo_id(str(args.source)) or str(args.source)
    scripts = node_scripts(plan, model_ref=model_ref) if plan.best else []
    written = []
    if args.export:
        written = export_launch_scripts(plan, args.export, model_ref=model_ref)
    if args.json:
        document = plan.to_dict()
        document["scripts"] = {script.filename: script.text for script in scripts}
        document["exported"] = [str(path) for path in written]
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0 if plan.best else 1
    print(
        f"{plan.model} on {cluster.name} ({cluster.gpu_count} GPUs in {len(cluster.nodes)} nodes), {plan.engine}"
    )
    print(
        f"context {plan.context_tokens}, batch {plan.batch_size}, weights {plan.weight_dtype}, "
        f"KV cache {plan.kv_cache_dtype}"
    )
    print()
    print(f"{'candidate':<12} {'GPUs':>4} {'fits':>4} {'decode':>12} {'pipelined':>12} "
          f"{'prefill':>14} {'peak per GPU':>12}  layers per stage")  # fmt: skip
    for c in plan.candidates[: max(args.candidates, 1)]:
        worst = max(c.stages, key=lambda s: s.total_bytes)
        print(
            f"{c.label:<12} {c.gpus_used:>4} {'yes' if c.fits else 'no':>4} "
            f"{format_rate(c.decode_tokens_per_s):>12} "
            f"{format_rate(c.pipelined_tokens_per_s):>12} "
            f"{format_rate(c.prefill_tokens_per_s):>14} {format_nbytes(worst.total_bytes):>12}  "
            f"{','.join(map(str, c.layer_partition))}"
        )
    print()
    for line in plan.trace:
        print(f"- {line}")
    best = plan.best
    if best is None:
        return 1
    for line in best.trace:
        print(f"- {line}")
    print()
    for stage in best.stages:
        print(
            f"stage {stage.index}: {stage.node_name} GPUs {','.join(map(str, stage.gpus))}, "
            f"layers {stage.first_layer}-{stage.first_layer + stage.layer_count - 1}, "
            f"{stage.total_bytes / GIB:.1f} of {stage.budget_bytes / GIB:.1f} GiB per GPU "
            f"(weights {stage.weights_bytes / GIB:.1f}, KV {stage.kv_cache_bytes / GIB:.1f}, "
            f"activations {stage.activation_bytes / GIB:.2f}, overhead {stage.overhead_bytes / GIB:.1f})"
        )
    for script in scripts:
        print()
        print(f"# --- {script.filename}")
        print(script.text, end="")
    if written:
        print()
        print(f"wrote {len(written)} files to {args.export}")
    return 0
