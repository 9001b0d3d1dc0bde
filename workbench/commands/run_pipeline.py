"""``workbench run SOURCE --pipeline-stages N``: the model split into N pipeline stages, one
gloo process each, with ``torch.distributed.pipelining`` (see ``workbench.runtime.pipeline_run``).

Locally every stage runs on this machine over loopback. Across real nodes, start the same
command on each with ``--nnodes``, ``--node-rank`` and ``--master-addr`` (node 0's address):
each node runs ``N / nnodes`` stages, and the node holding the last stage prints the result.
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace
from typing import Any

from workbench.runtime import BadInputError

PROMPT_TOKENS = 8  # seeded random ids when there is no prompt (or no tokenizer)


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """The pipeline options of ``workbench run``."""
    group = parser.add_argument_group("pipeline split (torch.distributed.pipelining, CPU, gloo)")
    group.add_argument(
        "--pipeline-stages",
        type=int,
        metavar="N",
        help="split the model into N stages, one process each, planned by the cluster planner",
    )
    group.add_argument("--nnodes", type=int, default=1, help="nodes taking part (default 1)")
    group.add_argument("--node-rank", type=int, default=0, help="this node's rank (default 0)")
    group.add_argument(
        "--master-addr", default="127.0.0.1", help="node 0's address (default: loopback)"
    )
    group.add_argument("--master-port", type=int, help="rendezvous port (default: free / 29500)")


def run_pipeline_command(args: argparse.Namespace) -> int:
    """Run ``args.source`` split into ``args.pipeline_stages`` stages; print what each measured."""
    from workbench.models.intake import open_model  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.model_inputs import prepare_input_ids  # noqa: PLC0415 (torch: not at CLI start)
    from workbench.runtime.pipeline_run import planned_stages, run_pipeline  # noqa: PLC0415 (torch: not at CLI start)

    if args.pipeline_stages < 1:
        raise BadInputError(f"--pipeline-stages must be at least 1, got {args.pipeline_stages}")
    if args.max_new_tokens < 1:
        raise BadInputError("--pipeline-stages generates at least one token: --max-new-tokens >= 1")
    if args.device_map:
        raise BadInputError("--device-map and --pipeline-stages exclude each other")
    opened = open_model(args.source)
    tokenizer = _tokenizer(opened)
    ids = prepare_input_ids(
        SimpleNamespace(tokenizer=tokenizer, model=opened.model, opened=opened),
        args.prompt,
        PROMPT_TOKENS,
    )[0].tolist()
    stages = planned_stages(
        opened, args.pipeline_stages, chunk_tokens=len(ids) + args.max_new_tokens
    )
    result = run_pipeline(
        str(args.source),
        stages,
        ids,
        max_new_tokens=args.max_new_tokens,
        dtype=args.dtype,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
    )
    if result is None:
        print(f"node {args.node_rank}: its stages finished; node {args.nnodes - 1} has the result")
        return 0
    text = tokenizer.decode(result.tokens) if tokenizer is not None else None
    if args.json:
        document: dict[str, Any] = {"source": str(args.source), **result.to_dict(), "text": text}
        print(json.dumps(document, indent=2, sort_keys=True))
        return 0
    if text is not None:
        print(text)
    print(f"{len(result.tokens)} tokens: {result.tokens}")
    print(
        f"{len(stages)} stages: prefill {result.prefill_s * 1000:.1f} ms, decode "
        f"{result.decode_tokens_per_s:.2f} tokens/s (no KV cache: each step is a full forward)"
    )
    for report in result.stages:
        last = report.first_layer + report.layer_count - 1
        print(
            f"  stage {report.rank}: layers {report.first_layer}-{last}, read "
            f"{report.nbytes_read / 2**20:.1f} MiB, RSS {report.rss_after_load / 2**20:.0f} MiB "
            f"after load (peak {report.rss_peak / 2**20:.0f} MiB), planned "
            f"{report.planned_bytes / 2**20:.0f} MiB"
        )
    return 0


def _tokenizer(opened: Any) -> Any:
    if opened.tokenizer_dir is None:
        return None
    from transformers import AutoTokenizer  # noqa: PLC0415 (transformers: not at CLI start)

    return AutoTokenizer.from_pretrained(opened.tokenizer_dir)
