"""Command-line entry point: ``workbench [--demo | --open SOURCE]`` opens the GUI, subcommands
run headless over the same runtime code.

Each subcommand lives in ``workbench/commands/<name>.py`` and exposes
``register(subparsers) -> None``, which adds its parser and sets ``func=run(args) -> int``.
Exit codes: 0 success, 1 runtime failure, 2 bad input (any ``BadInputError``, a missing file,
or a usage error), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

from workbench import __version__

COMMAND_MODULES: tuple[str, ...] = (
    "workbench.commands.inspect",
    "workbench.commands.plan",
    "workbench.commands.make_demo",
    "workbench.commands.profiles",
    "workbench.commands.run",
    "workbench.commands.desktop",
)

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def build_parser() -> argparse.ArgumentParser:
    """Return the parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="workbench",
        description="Plan, load and watch PyTorch models that are too big for one device. "
        "With no subcommand the desktop app opens.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log diagnostics to stderr")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--demo", action="store_true", help="open the app on the bundled demo model")
    group.add_argument(
        "--open", metavar="SOURCE", help="open the app on a config.json or model folder"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code."""
    if getattr(sys, "frozen", False):
        import multiprocessing

        multiprocessing.freeze_support()  # the worker process is spawned from the bundle too
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s"
    )
    if args.command is None:
        return _run_gui(args)
    return _run_guarded(args.func, args)


def _run_gui(args: argparse.Namespace) -> int:
    from workbench.gui.app import run_app  # Qt is imported only when the GUI is wanted

    return run_app(open_source=args.open, demo=args.demo)


def _run_guarded(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    from workbench.big_modeling.errors import BadInputError

    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (BadInputError, FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:
        logging.getLogger(__name__).debug("command failed", exc_info=True)
        print(f"failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    raise SystemExit(main())
