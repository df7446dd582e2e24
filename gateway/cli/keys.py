"""`owngate keys new --tenant T`: make a tenant API key; only its hash is stored."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gateway.cli._common import env_default, load_or_report, usage
from gateway.keys import add_key_hash, hash_api_key, new_api_key

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("keys", help="make tenant API keys and log signing keys")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    new = verbs.add_parser(
        "new",
        help="create a tenant API key or a provenance-log signing key",
        description="--tenant T: create an API key for a tenant; the key is printed once on "
        "stdout and only its SHA-256 digest is stored, in the keys_file named by the config "
        "(a running gateway picks it up on restart). --signing NAME: write an Ed25519 "
        "signing key for the provenance log (mode 0600) and print its verifier key, which "
        "auditors use.",
    )
    which = new.add_mutually_exclusive_group(required=True)
    which.add_argument("--tenant", help="tenant id (must exist in the config)")
    which.add_argument(
        "--signing", metavar="NAME", help="create a log signing key named NAME (the log origin)"
    )
    new.add_argument(
        "--key-file",
        default=env_default("OWNGATE_SIGNING_KEY", "provenance.key"),
        help="with --signing: where to write the key (env OWNGATE_SIGNING_KEY, "
        "default ./provenance.key); an existing file is never overwritten",
    )
    new.add_argument(
        "--config",
        default=env_default("OWNGATE_CONFIG", "gateway.yaml"),
        help="path to gateway.yaml (env OWNGATE_CONFIG, default ./gateway.yaml)",
    )
    new.set_defaults(handler=_new)
    parser.set_defaults(handler=lambda _args: usage(parser))


def _new(args: argparse.Namespace) -> int:
    if args.signing is not None:
        return _new_signing_key(args.key_file, args.signing)
    config = load_or_report(args.config)
    if config is None:
        return 1
    if args.tenant not in {t.id for t in config.tenants}:
        print(f"error: tenant {args.tenant!r} is not defined in {args.config}", file=sys.stderr)
        return 1
    if config.keys_file is None:
        print(
            f"error: {args.config} has no keys_file; add e.g. 'keys_file: keys.yaml' so the "
            "key's hash has somewhere to be stored",
            file=sys.stderr,
        )
        return 1
    key = new_api_key()
    path = Path(args.config).parent / config.keys_file
    add_key_hash(path, args.tenant, hash_api_key(key))
    print(key)
    print(
        f"stored the key's SHA-256 digest for tenant {args.tenant!r} in {path}; "
        "the key itself is shown only this once",
        file=sys.stderr,
    )
    return 0


def _new_signing_key(path: str, name: str) -> int:
    from gateway.provenance import KeyFormatError, write_signing_key

    try:
        vkey = write_signing_key(path, name)
    except (FileExistsError, KeyFormatError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(vkey)
    print(
        f"wrote the signing key to {path} (mode 0600); give auditors the verifier key above",
        file=sys.stderr,
    )
    return 0
