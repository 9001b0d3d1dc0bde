"""Entry point of the frozen desktop bundle (``app.spec`` writes a script that calls
:func:`bundle_main`); usable from source too.

It sits above the CLI so that nothing below imports the CLI: the GUI and
``workbench.platform_integration`` never do.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Sequence

from workbench.cli import main, runs_headless
from workbench.platform_integration import (
    SMOKE_ENV,
    SMOKE_TIMEOUT_ENV,
    install_smoke_test,
    set_windows_app_user_model_id,
)


def bundle_main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI as the desktop bundle: multiprocessing support for the spawned worker, the
    Windows identity, an optional offscreen smoke test, then :func:`workbench.cli.main`.

    Environment:
        WORKBENCH_SMOKE_TEST=1: quit as soon as a model is open (use with ``--demo``);
        WORKBENCH_SMOKE_TIMEOUT_S: give up after this many seconds (default 120).

    Returns:
        The exit code of :func:`workbench.cli.main`.
    """
    multiprocessing.freeze_support()  # the load worker is spawned from this executable
    set_windows_app_user_model_id()
    args = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get(SMOKE_ENV) and not runs_headless(args):
        install_smoke_test(float(os.environ.get(SMOKE_TIMEOUT_ENV, "120")))
    return main(args)
