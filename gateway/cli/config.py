"""`owngate config validate`: check a config file with the same code the server uses.

It loads the file as `owngate serve` does, then builds the gateway from it as `serve`
does before it listens (`gateway.validation.validate`, the same `assemble`): the backend
registry, the tenant key index, the trust policies compiled against the backends, the
key variables each backend names in this environment, and the provenance log's keys and
directory (checked, never opened for writing). Every problem is printed in one run.
`--without-secrets` skips what only the machine that serves has (key variables, signing
keys, backend TLS files, the log directory). `--workers N` checks the log directory and
high-water file of each worker `serve --workers N` would start. Exit codes: 0 ok, 1
invalid, 2 usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from gateway.cli._common import env_default, load_file_or_report, usage

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("config", help="work with gateway.yaml")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    validate = verbs.add_parser(
        "validate",
        help="validate a config file as `owngate serve` would",
        description="Validate a config file with the code `owngate serve` runs: the schema "
        "(every problem with its YAML path and line), then the gateway built from it: "
        "backend key variables in this environment, tenant key hashes, the trust policies "
        "compiled against the backends, the provenance signing keys and log directory. "
        "Connects to nothing and writes nothing. Every problem is printed at once. Exit 0 "
        "when `serve` would start, 1 when it would refuse.",
    )
    validate.add_argument("file", help="path to gateway.yaml")
    validate.add_argument(
        "--without-secrets",
        action="store_true",
        default=env_default("OWNGATE_VALIDATE_WITHOUT_SECRETS", "") not in ("", "0", "false"),
        help="check a config meant for another machine (a pod that mounts its secrets): "
        "backend key variables unset here count as set, the provenance signing keys, the "
        "backends' TLS files and the log directory are not looked at "
        "(env OWNGATE_VALIDATE_WITHOUT_SECRETS=1)",
    )
    validate.add_argument(
        "--workers",
        type=int,
        default=int(env_default("OWNGATE_WORKERS", "1")),
        help="check the config as `serve --workers N` runs it: each worker's own log "
        "directory and high-water file (env OWNGATE_WORKERS, default 1)",
    )
    validate.set_defaults(handler=_validate)
    parser.set_defaults(handler=lambda _args: usage(parser))


def _validate(args: argparse.Namespace) -> int:
    from gateway.config.env_refs import unquoted
    from gateway.validation import validate

    if args.workers < 1:
        print("error: --workers must be at least 1", file=sys.stderr)
        return 2
    loaded = load_file_or_report(args.file)
    if loaded is None:
        return 1
    config, text = loaded
    found = validate(
        config,
        environ=os.environ,
        config_dir=Path(args.file).parent,
        secrets=not args.without_secrets,
        workers=args.workers,
    )
    problems = unquoted(found, text, os.environ)  # never what a `${VAR}` filled in
    if problems:
        print(
            f"{args.file}: owngate serve would refuse this config ({len(problems)} problem(s)):",
            file=sys.stderr,
        )
        print("\n".join(f"  {problem}" for problem in problems), file=sys.stderr)
        return 1
    models = {m.name for b in config.backends for m in b.models}
    print(
        f"{args.file}: ok ({len(config.backends)} backends, {len(models)} models, "
        f"{len(config.tenants)} tenants)"
    )
    return 0
