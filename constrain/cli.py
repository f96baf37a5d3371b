"""`structgen check-schema` and `structgen maskbench`: registered on the top-level parser by service/cli.py."""

from __future__ import annotations


def add_commands(subparsers) -> None:
    """Add this package's subcommands to the `structgen` parser."""
