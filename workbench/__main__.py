"""``python -m workbench`` runs the command-line entry point."""

from __future__ import annotations

from workbench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
