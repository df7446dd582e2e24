"""Helpers shared by subcommands: environment defaults and config loading."""

from __future__ import annotations

import argparse
import os
import sys

from gateway.config import ConfigError, GatewaySettings
from gateway.config.loader import load_config_file
from gateway.provenance.audit.shown import MAX_SHOWN_MESSAGE, shown

__all__ = ["env_default", "load_file_or_report", "load_or_report", "usage"]


def env_default(name: str, default: str) -> str:
    return os.environ.get(name, default)


def load_or_report(path: str) -> GatewaySettings | None:
    """Load a config; print every problem to stderr and return None when it is invalid.
    Each line of the report is `shown`: a problem may quote the keys file (its tenants)."""
    loaded = load_file_or_report(path)
    return None if loaded is None else loaded[0]


def load_file_or_report(path: str) -> tuple[GatewaySettings, str] | None:
    """`load_or_report`, and the text it read (to `unquoted` what assembling it finds)."""
    try:
        return load_config_file(path)
    except ConfigError as exc:
        lines = str(exc).split("\n")  # the lines it is made of, not str.splitlines's
        print("\n".join(shown(line, MAX_SHOWN_MESSAGE) for line in lines), file=sys.stderr)
        return None


def usage(parser: argparse.ArgumentParser) -> int:
    """A noun given without a verb: show its help, exit 2."""
    parser.print_help()
    return 2
