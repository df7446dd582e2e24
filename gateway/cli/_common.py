"""Helpers shared by subcommands: environment defaults and config loading."""

from __future__ import annotations

import argparse
import os
import sys

from gateway.config import ConfigError, GatewaySettings, load_config
from gateway.provenance.audit.shown import MAX_SHOWN_MESSAGE, shown

__all__ = ["env_default", "load_or_report", "usage"]


def env_default(name: str, default: str) -> str:
    return os.environ.get(name, default)


def load_or_report(path: str) -> GatewaySettings | None:
    """Load a config; print every problem to stderr and return None when it is invalid.
    Each line of the report is `shown`: a problem may quote the keys file (its tenants)."""
    try:
        return load_config(path)
    except ConfigError as exc:
        lines = str(exc).split("\n")  # the lines it is made of, not str.splitlines's
        print("\n".join(shown(line, MAX_SHOWN_MESSAGE) for line in lines), file=sys.stderr)
        return None


def usage(parser: argparse.ArgumentParser) -> int:
    """A noun given without a verb: show its help, exit 2."""
    parser.print_help()
    return 2
