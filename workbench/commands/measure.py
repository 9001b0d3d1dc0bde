"""``workbench measure``: measure this machine's host probes again (dispatch costs, the CPU
matmul curve, the CPU kernels), replacing their cached figures; ``--json`` for scripts.

Torch comes in only when the command runs: the CLI imports this module to build its parser.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "measure",
        help="measure this machine again (dispatch costs, CPU matmul speed, CPU kernels)",
        description="Forget this machine's cached host measurements and take them again: the "
        "cost per module call and per forward, the CPU's one-token matmul time by weight "
        "size, and its quantized kernels' read rates. The detected profile's predictions "
        "use them. 10 to 40 s on two cores.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workbench.models.host_measurements import measure_host_again  # noqa: PLC0415 (torch: not at CLI start)

    if not args.json:
        print("measuring this machine (10 to 40 s)...", file=sys.stderr, flush=True)
    measured = measure_host_again()
    if args.json:
        json.dump(measured.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for line in measured.lines():
            print(line)
    return 0 if measured.complete else 1
