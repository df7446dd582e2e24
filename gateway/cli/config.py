"""`owngate config validate`: check a config file with the same code the server uses."""

from __future__ import annotations

import argparse
from typing import Any

from gateway.cli._common import load_or_report, usage

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("config", help="work with gateway.yaml")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    validate = verbs.add_parser(
        "validate",
        help="validate a config file",
        description="Validate a config file; every problem is printed with its YAML path and "
        "line. Exit 0 when valid, 1 when not.",
    )
    validate.add_argument("file", help="path to gateway.yaml")
    validate.set_defaults(handler=_validate)
    parser.set_defaults(handler=lambda _args: usage(parser))


def _validate(args: argparse.Namespace) -> int:
    config = load_or_report(args.file)
    if config is None:
        return 1
    models = {m.name for b in config.backends for m in b.models}
    print(
        f"{args.file}: ok ({len(config.backends)} backends, {len(models)} models, "
        f"{len(config.tenants)} tenants)"
    )
    return 0
