"""Command-line entry point: ``workbench [--demo | --open SOURCE | PATH]`` opens the GUI,
subcommands run headless over the same runtime code.

``workbench PATH`` is ``workbench --open PATH``, as users type it and as file managers pass it
(the ``.desktop`` entry's ``Exec=workbench %f``): PATH is a model folder, a config.json, a
saved session or a device-map file (the window tells them apart, see
``workbench.runtime.documents``), or a bundled config's name. A first word that names a
subcommand runs the subcommand; any other word is taken as PATH when it looks like one (an
existing file or folder, a path with a ``/``, a ``.json`` name, ``hf-cache:REPO`` or a bundled
config's name), so a mistyped subcommand still gets argparse's "invalid choice" message.

Each subcommand lives in ``workbench/commands/<name>.py`` and exposes
``register(subparsers) -> None``, which adds its parser and sets ``func=run(args) -> int``.
Exit codes: 0 success, 1 runtime failure, 2 bad input (any ``BadInputError``, a missing file,
or a usage error), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import multiprocessing
import os
import sys
from collections.abc import Callable, Collection, Sequence

from workbench import __version__
from workbench.big_modeling.errors import BadInputError
from workbench.models.catalog import is_bundled_name
from workbench.runtime.import_noise import quiet_import_noise

COMMAND_MODULES: tuple[str, ...] = (
    "workbench.commands.inspect",
    "workbench.commands.plan",
    "workbench.commands.fit",
    "workbench.commands.cluster_plan",
    "workbench.commands.make_demo",
    "workbench.commands.profiles",
    "workbench.commands.measure",
    "workbench.commands.run",
    "workbench.commands.desktop",
)

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def build_parser() -> argparse.ArgumentParser:
    """Return the parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="workbench",
        usage="%(prog)s [-h] [--version] [-v] [--demo | --open SOURCE | PATH]\n"
        "       %(prog)s [-v] COMMAND ...",
        description="Plan, load and watch PyTorch models that are too big for one device. "
        "With no subcommand the desktop app opens, on PATH when given (a model folder, "
        "config.json, saved session or device-map file).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log diagnostics to stderr")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--demo", action="store_true", help="open the app on the bundled demo model")
    group.add_argument(
        "--open",
        metavar="SOURCE",
        help="open the app on a model folder, config.json, saved session or device-map file "
        "(`workbench PATH` does the same)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code."""
    if getattr(sys, "frozen", False):
        multiprocessing.freeze_support()  # the worker process is spawned from the bundle too
    parser = build_parser()
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(_positional_source_as_open(parser, arguments))
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s"
    )
    if not args.verbose:
        quiet_import_noise()
    if args.command is None:
        return _run_gui(args)
    return _run_guarded(args.func, args)


def looks_like_source(word: str) -> bool:
    """True for a word that names something to open rather than a subcommand: an existing
    file or folder, a path with a separator, a ``.json`` name, ``hf-cache:REPO`` or a
    bundled config's name (``llama-3.1-70b``, as ``--open`` takes it)."""
    return (
        os.path.exists(word)
        or "/" in word
        or os.sep in word
        or word.endswith(".json")
        or word.startswith("hf-cache:")
        or is_bundled_name(word)
    )


def first_positional(arguments: Sequence[str]) -> int | None:
    """Index of the first word that is neither an option nor the value of ``--open``."""
    skip_next = False
    for index, word in enumerate(arguments):
        if skip_next:
            skip_next = False
        elif word == "--open":
            skip_next = True
        elif not word.startswith("-"):
            return index
    return None


def subcommand_names(parser: argparse.ArgumentParser | None = None) -> Collection[str]:
    """The names of the registered subcommands (of ``parser``, default a new one)."""
    for action in (parser or build_parser())._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.keys()
    return ()


def runs_headless(arguments: Sequence[str]) -> bool:
    """True when ``arguments`` run a subcommand (or just print help or the version) rather
    than open the GUI; ``workbench PATH`` opens the GUI."""
    values = iter(arguments)
    for word in values:
        if word in ("-h", "--help", "--version"):
            return True
        if word == "--open":
            next(values, None)  # the SOURCE value, not a subcommand
        elif not word.startswith("-"):
            return word in subcommand_names() or not looks_like_source(word)
    return False


def _positional_source_as_open(parser: argparse.ArgumentParser, arguments: list[str]) -> list[str]:
    """Rewrite ``workbench [OPTIONS] PATH`` as ``workbench [OPTIONS] --open PATH``."""
    index = first_positional(arguments)
    if index is None:
        return arguments
    word = arguments[index]
    if word in subcommand_names(parser) or not looks_like_source(word):
        return arguments
    if any(a == "--open" or a.startswith("--open=") for a in arguments[:index]):
        parser.error(f"give one thing to open: --open SOURCE or PATH, not both ({word})")
    if len(arguments) > index + 1:
        parser.error(f"unexpected arguments after {word}: {' '.join(arguments[index + 1 :])}")
    return [*arguments[:index], "--open", word]


def _run_gui(args: argparse.Namespace) -> int:
    from workbench.gui.app import run_app  # noqa: PLC0415 (Qt only when the GUI is wanted)

    return run_app(open_source=args.open, demo=args.demo)


def _run_guarded(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
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
