"""Headless subcommands; each module exposes ``register(subparsers)``."""
