"""Entry point of the `owngate` command.

Each subcommand lives in its own module exposing `register(subparsers)`, which adds its
parser and sets `handler=<callable(args) -> int>`. Exit codes: 0 ok, 1 failed check or
runtime failure, 2 usage error.

When the first argument names a command, only that command's module is imported: an
auditor's install (`gateway.provenance` and its dependencies, no web framework, no Redis)
runs `owngate audit ...` and `owngate witness vkey` this way. `owngate --help` and anything
else that does not start with a command name imports every module, to list them all.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gateway import __version__

__all__ = ["build_parser", "entrypoint", "main"]

# Subcommand modules, in `owngate --help` order, imported only to build the parser: none
# does work at import time.
_COMMANDS = (
    "serve",
    "demo",
    "sim",
    "attest",
    "config",
    "keys",
    "policy",
    "audit",
    "witness",
    "backend",
    "bench",
    "status",
)


def build_parser(commands: Sequence[str] = _COMMANDS) -> argparse.ArgumentParser:
    """The `owngate` parser with the given subcommands (default: all of them)."""
    parser = argparse.ArgumentParser(
        prog="owngate",
        description="OpenAI-compatible gateway that routes to your own GPUs first.",
        epilog="Exit codes: 0 ok, 1 failed check or runtime failure, 2 usage error.",
    )
    parser.add_argument("--version", action="version", version=f"owngate {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in commands:
        module = importlib.import_module(f"gateway.cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    chosen = words[:1] if words and words[0] in _COMMANDS else _COMMANDS
    parser = build_parser(chosen)
    args = parser.parse_args(words)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    result: int = handler(args)
    return result


def entrypoint() -> None:
    try:
        code = main()
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
