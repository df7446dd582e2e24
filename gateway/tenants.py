"""Tenants and their API keys: the key index the gateway authenticates against, key and
admin-token generation, hashing, and the key-hash file `owngate keys` writes.

Keys are 32 random bytes (base64url, prefixed `og-`); only `sha256:<hex>` digests are
stored. A fast hash is right here: the keys are random and high-entropy, so there is
nothing for a slow KDF to protect, and hashing sits on every request. `index_keys` maps
each digest to its tenant (`TenantEntry`: the models it may use, its rate limits); a
request's key is one dict lookup there.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gateway.config.schema import TenantSettings
from gateway.small_files import read_small_file
from gateway.state.types import TenantLimits

__all__ = [
    "ADMIN_TOKEN_PREFIX",
    "KEY_PREFIX",
    "TenantEntry",
    "add_key_hash",
    "hash_api_key",
    "index_keys",
    "key_hash_of",
    "keys_file_lock",
    "new_admin_token",
    "new_api_key",
    "read_keys_file",
    "remove_key_hash",
    "tenant_limits",
]

KEY_PREFIX = "og-"
ADMIN_TOKEN_PREFIX = "og-admin-"  # noqa: S105 - a prefix, not a secret
_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
# About 75 bytes a key: room for 200,000 keys, and a bound on what a wrong path costs.
_MAX_KEYS_FILE = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TenantEntry:
    """A configured tenant as the request path sees it."""

    id: str
    all_models: bool
    models: frozenset[str]
    limits: TenantLimits = field(default_factory=TenantLimits)
    # Tokens reserved per answer of a request without max_tokens (gateway/api/reservation.py);
    # None: the default share of `limits.tokens_per_minute`.
    reserved_tokens_per_answer: int | None = None
    # Tokens reserved per image, audio, video or file part; None: `MEDIA_RESERVED`.
    reserved_tokens_per_media: int | None = None

    def may_use(self, model: str) -> bool:
        return self.all_models or model in self.models


def tenant_limits(tenant: TenantSettings) -> TenantLimits:
    """The limits the state enforces for a configured tenant."""
    return TenantLimits(
        requests_per_minute=tenant.limits.requests_per_minute,
        tokens_per_minute=tenant.limits.tokens_per_minute,
        concurrent=tenant.limits.concurrent_requests,
    )


def index_keys(tenants: Iterable[TenantSettings]) -> dict[str, TenantEntry]:
    """Each tenant API key digest (`sha256:<hex>`) to its tenant. Raises ValueError
    naming every digest listed for two tenants, one per line."""
    index: dict[str, TenantEntry] = {}
    problems: list[str] = []
    for tenant in tenants:
        limits = tenant_limits(tenant)
        entry = TenantEntry(
            tenant.id,
            "*" in tenant.models,
            frozenset(tenant.models),
            limits,
            tenant.limits.reserved_tokens_per_answer,
            tenant.limits.reserved_tokens_per_media,
        )
        for key_hash in tenant.api_key_hashes:
            other = index.setdefault(key_hash, entry)
            if other is not entry:
                problems.append(
                    f"one API key hash is listed for tenants {other.id!r} and {tenant.id!r}"
                )
    if problems:
        raise ValueError("\n".join(problems))
    return index


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_admin_token() -> str:
    """A token for the admin surface (`admin.token_hashes` holds its `hash_api_key`)."""
    return ADMIN_TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(key: str | bytes) -> str:
    raw = key.encode() if isinstance(key, str) else key
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def key_hash_of(key_or_hash: str) -> str:
    """The stored form of a key given either as the key itself or as its digest."""
    text = key_or_hash.strip()
    if _HASH.match(text):
        return text
    if not text:
        raise ValueError("an empty string is not an API key")
    return hash_api_key(text)


def read_keys_file(path: Path) -> dict[str, list[str]]:
    """Read `{tenants: {TENANT: [sha256:...]}}`; a missing file holds no keys."""
    try:
        raw = read_small_file(path, _MAX_KEYS_FILE)
    except FileNotFoundError:
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None  # never the bytes it holds
    data = yaml.safe_load(text) or {}
    tenants = data.get("tenants", {}) if isinstance(data, dict) else None
    if not isinstance(tenants, dict):
        raise ValueError(f"{path}: expected a mapping 'tenants: {{TENANT: [sha256:...]}}'")
    result: dict[str, list[str]] = {}
    for tenant, hashes in tenants.items():
        if not isinstance(hashes, list) or not all(
            isinstance(h, str) and _HASH.match(h) for h in hashes
        ):
            raise ValueError(f"{path}: tenants.{tenant} must be a list of 'sha256:<hex>' digests")
        result[str(tenant)] = list(hashes)
    return result


def add_key_hash(path: Path, tenant: str, key_hash: str) -> None:
    """Append a digest to the key file atomically (write a temp file, fsync, rename)."""
    with keys_file_lock(path):
        stored = read_keys_file(path)
        stored.setdefault(tenant, []).append(key_hash)
        _write_keys_file(path, stored)


def remove_key_hash(path: Path, key_hash: str) -> str | None:
    """Remove a digest from the key file atomically; the tenant it belonged to, or None
    when the file does not hold it (then the file is left untouched, and no lock is taken:
    a key listed inline in gateway.yaml is revoked with a keys file on a read-only mount)."""
    if not any(key_hash in hashes for hashes in read_keys_file(path).values()):
        return None  # no change adds back a digest it removes: absent stays absent
    with keys_file_lock(path):
        stored = read_keys_file(path)
        owner = next((tenant for tenant, hashes in stored.items() if key_hash in hashes), None)
        if owner is None:
            return None
        stored[owner] = [h for h in stored[owner] if h != key_hash]
        _write_keys_file(path, stored)
        return owner


@contextlib.contextmanager
def keys_file_lock(path: Path) -> Iterator[None]:
    """Hold the exclusive `flock` on `.<name>.lock` beside the keys file `path` while its
    digests are read, changed and written back: one change at a time, across threads (the
    admin API's key endpoints run in worker threads) and processes (`owngate keys` beside
    a running gateway). Without it two changes read the same file and the second rename
    drops the first's: a new key lost, or a revoked key's digest written back (accepted
    again once the process restarts)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks: the holder only reads and renames a file
        yield
    finally:
        os.close(fd)  # releases the flock


def _write_keys_file(path: Path, stored: dict[str, list[str]]) -> None:
    """Replace the key file in one rename (temp file fsynced first): a reader sees the
    old file or the new one, never half of one."""
    body = "# Written by `owngate keys`: SHA-256 digests of tenant API keys.\n"
    body += yaml.safe_dump({"tenants": stored}, sort_keys=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # the replacement keeps the file's mode, so a gateway that read it still can
        mode: int | None = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = None  # a new file stays mkstemp's 0600
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
