"""`owngate keys new --tenant T`: make a tenant API key; only its hash is stored.
`owngate keys new --admin`: make an admin token and print its hash for the config.
`owngate keys revoke KEY`: stop accepting a tenant API key (on every replica at once
with `state: redis`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from gateway.cli._common import env_default, load_or_report, usage
from gateway.config import GatewaySettings
from gateway.provenance.audit.shown import MAX_SHOWN_MESSAGE, shown
from gateway.state.revocation_list import add_revocations
from gateway.tenants import (
    add_key_hash,
    hash_api_key,
    key_hash_of,
    new_admin_token,
    new_api_key,
    read_keys_file,
    remove_key_hash,
)

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "keys", help="make tenant API keys, admin tokens and log signing keys"
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    new = verbs.add_parser(
        "new",
        help="create a tenant API key, an admin token or a provenance-log signing key",
        description="--tenant T: create an API key for a tenant; the key is printed once on "
        "stdout and only its SHA-256 digest is stored, in the keys_file named by the config "
        "(a running gateway reads it within its reload poll, on SIGHUP or at a restart). "
        "--signing NAME: write an Ed25519 "
        "signing key for the provenance log (mode 0600) and print its verifier key, which "
        "auditors use. --admin: print a new admin token on stdout and its digest (for "
        "admin.token_hashes) on stderr; nothing is written.",
    )
    which = new.add_mutually_exclusive_group(required=True)
    which.add_argument("--tenant", help="tenant id (must exist in the config)")
    which.add_argument(
        "--signing", metavar="NAME", help="create a log signing key named NAME (the log origin)"
    )
    which.add_argument(
        "--admin",
        action="store_true",
        help="create an admin token for /admin/status, `owngate status` and the admin API; "
        "put the digest it prints in gateway.yaml under admin.token_hashes (full access) or "
        "admin.tokens with a role (docs/admin-api.md)",
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
    revoke = verbs.add_parser(
        "revoke",
        help="stop accepting a tenant API key",
        description="Revoke a tenant API key, given as the key or as its 'sha256:<hex>' "
        "digest. It is added to this host's revoked keys list (state.revocations_file), "
        "which every gateway started here later reads: they refuse it, Redis up or down. "
        "With 'state: redis' in the config the revocation is stored in Redis and "
        "every running replica that reaches Redis refuses the key within one sync "
        "interval (a degraded one once it reaches Redis again); the digest is "
        "also removed from the keys_file (atomically), so restarted gateways do not accept "
        "it either. Running gateways on this host read the list again within about a "
        "second and refuse the key, Redis up or down; without Redis, those on other hosts "
        "refuse it once they reload the keys_file (its poll sees the change, or SIGHUP) or "
        "at a restart. Exit codes: 0 revoked, 1 failed "
        "(unknown key, Redis unreachable, the list not written, invalid config), 2 usage.",
    )
    revoke.add_argument("key", metavar="KEY_OR_HASH", help="the API key or its sha256: digest")
    revoke.add_argument(
        "--config",
        default=env_default("OWNGATE_CONFIG", "gateway.yaml"),
        help="path to gateway.yaml (env OWNGATE_CONFIG, default ./gateway.yaml)",
    )
    revoke.set_defaults(handler=_revoke)
    parser.set_defaults(handler=lambda _args: usage(parser))


def _new(args: argparse.Namespace) -> int:
    if args.signing is not None:
        return _new_signing_key(args.key_file, args.signing)
    if args.admin:
        return _new_admin_token()
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
    try:
        add_key_hash(path, args.tenant, hash_api_key(key))
    except OSError as exc:  # the lock busy past its wait, or the file not writable
        print(f"error: {path} was not changed: {_why(exc)}; no key was created", file=sys.stderr)
        return 1
    print(key)
    print(
        f"stored the key's SHA-256 digest for tenant {args.tenant!r} in {path}; "
        "the key itself is shown only this once",
        file=sys.stderr,
    )
    return 0


def _revoke(args: argparse.Namespace) -> int:
    try:
        key_hash = key_hash_of(args.key)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    config = load_or_report(args.config)
    if config is None:
        return 1
    keys_path = Path(args.config).parent / config.keys_file if config.keys_file else None
    stored = read_keys_file(keys_path) if keys_path is not None else {}
    # The loaded tenants hold the config's own hashes plus the keys file's.
    inline = [
        t.id
        for t in config.tenants
        if t.api_key_hashes.count(key_hash) > stored.get(t.id, []).count(key_hash)
    ]
    in_file = any(key_hash in hashes for hashes in stored.values())
    shared = config.state.backend == "redis"
    if not (in_file or inline or shared):
        print(f"error: no tenant in {args.config} has the key {key_hash}", file=sys.stderr)
        return 1
    saved = shared and _store_revocation(config, key_hash)
    listed = _list_revocation(Path(args.config).parent / config.state.revocations_file, key_hash)
    if in_file and keys_path is not None:
        try:
            tenant = remove_key_hash(keys_path, key_hash)
        except OSError as exc:
            print(f"error: {keys_path} was not changed: {_why(exc)}", file=sys.stderr)
            return 1
        print(f"removed {key_hash} (tenant {tenant!r}) from {keys_path}", file=sys.stderr)
    if inline:
        print(
            f"note: {args.config} itself lists this key for tenant(s) {', '.join(inline)} "
            "under api_key_hashes: remove it there too",
            file=sys.stderr,
        )
    elif not in_file:
        print(f"note: no tenant in {args.config} has this key", file=sys.stderr)
    if not saved:
        print(
            f"running gateways{' on other hosts' if listed else ''} accept the key until "
            "they reload their config (SIGHUP, or their poll of the keys file) or restart",
            file=sys.stderr,
        )
    if (shared and not saved) or not listed:
        return 1  # asked to revoke on every replica (or this host) now: that did not happen
    return 0 if saved or in_file else 1


def _list_revocation(path: Path, key_hash: str) -> bool:
    """Add the digest to this host's revoked keys list (`state.revocations_file`): every
    gateway process started here later refuses the key, Redis up or down."""
    try:
        add_revocations(path, [key_hash])
    except (OSError, ValueError) as exc:  # RevocationListError: a list it cannot read
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"error: {path} was not changed: {why}", file=sys.stderr)
        return False
    print(
        f"listed {key_hash} in {path}: gateways on this host refuse it, running ones within "
        "about a second (they read the list again), Redis up or down",
        file=sys.stderr,
    )
    return True


def _store_revocation(config: GatewaySettings, key_hash: str) -> bool:
    saved, reason = asyncio.run(_revoke_in_redis(config, key_hash))
    if saved:
        print(
            f"revoked {key_hash} in Redis: every running replica that reaches Redis "
            f"refuses it within {config.state.sync_interval_s:g} s",
            file=sys.stderr,
        )
    else:
        # The reason may quote Redis's own error text: shown escaped and bounded.
        why = shown(reason, MAX_SHOWN_MESSAGE)
        print(f"error: could not store the revocation in Redis ({why})", file=sys.stderr)
    return saved


async def _revoke_in_redis(config: GatewaySettings, key_hash: str) -> tuple[bool, str | None]:
    """Store the revocation through `RedisState.revoke_key` (one short-lived member:
    its lease is removed again on close)."""
    from gateway.state.redis_state import RedisState

    settings = config.state
    assert settings.url is not None
    state = RedisState(
        settings.url,
        replica_id=f"keys-revoke-{os.getpid()}",
        key_prefix=settings.key_prefix,
        timeout_s=max(settings.timeout_ms / 1000, 1.0),  # a person waits, not a request
        sync_interval_s=settings.sync_interval_s,
        lease_ttl_s=settings.lease_ttl_s,
    )
    try:
        await state.start()
        if not state.healthy:
            return False, state.degraded_reason
        if await state.revoke_key(key_hash):
            return True, None
        return False, state.degraded_reason
    finally:
        await state.close()


def _new_admin_token() -> int:
    token = new_admin_token()
    print(token)
    print(
        f"admin token digest: {hash_api_key(token)}\n"
        "add it to gateway.yaml as `admin: {token_hashes: [DIGEST]}` and give the token to "
        "`owngate status` (env OWNGATE_ADMIN_TOKEN); the token is shown only this once",
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
    except OSError as exc:  # a missing or read-only directory: the operator's to fix
        print(f"error: cannot write {path}: {exc.strerror}", file=sys.stderr)
        return 1
    print(vkey)
    print(
        f"wrote the signing key to {path} (mode 0600); give auditors the verifier key above",
        file=sys.stderr,
    )
    return 0


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)
