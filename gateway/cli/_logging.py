"""`--log-format` and `--log-level` for the long-running subcommands besides `serve`.

`serve` takes its logging from gateway.yaml (`logging:`); `attest`, `witness serve` and
`sim` have no config file, so they take the same two settings as flags, each with an
environment default `OWNGATE_<COMMAND>_LOG_FORMAT` / `_LOG_LEVEL`. Each calls
`start_logging` once before it serves: without it structlog keeps its default
configuration, whose console renderer prints a traceback with every exception's message
(which may quote a request) and escapes nothing, and the stdlib's last-resort handler
does the same for uvicorn's lines (gateway/logs.py).

Nothing is imported here at module level but argparse and os: `owngate witness` runs
on an auditor's install, where the logging libraries are imported only when it serves.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

__all__ = ["FORMATS", "LEVELS", "add_logging_flags", "start_logging"]

FORMATS = ("json", "console")
LEVELS = ("debug", "info", "warning", "error")


def add_logging_flags(parser: argparse.ArgumentParser, env_prefix: str) -> None:
    """Add `--log-format` (json, console) and `--log-level` (debug, info, warning, error),
    defaulting from `<env_prefix>LOG_FORMAT` and `<env_prefix>LOG_LEVEL`, else json and
    info as in gateway.yaml. A bad environment value is a usage error (exit 2), as a bad
    flag is: argparse passes a string default through `type`, never through `choices`."""
    parser.add_argument(
        "--log-format",
        type=_one_of(FORMATS),
        metavar="{" + ",".join(FORMATS) + "}",
        default=os.environ.get(f"{env_prefix}LOG_FORMAT", "json"),
        help=f"log lines as JSON or for a terminal (env {env_prefix}LOG_FORMAT, default json)",
    )
    parser.add_argument(
        "--log-level",
        type=_one_of(LEVELS),
        metavar="{" + ",".join(LEVELS) + "}",
        default=os.environ.get(f"{env_prefix}LOG_LEVEL", "info"),
        help=f"least severe level logged (env {env_prefix}LOG_LEVEL, default info)",
    )


def _one_of(names: tuple[str, ...]) -> Callable[[str], str]:
    def check(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(names)}")
        return text

    return check


def start_logging(args: argparse.Namespace) -> None:
    """Configure this process's logging as the parsed flags ask: redacted, escaped, every
    exception's message withheld from its traceback (gateway/logs.py)."""
    from gateway.logs import configure_logging

    configure_logging(args.log_format, args.log_level)
