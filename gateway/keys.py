"""Tenant API keys: generation, hashing and the key-hash file.

Keys are 32 random bytes (base64url, prefixed `og-`); only `sha256:<hex>` digests are
stored. A fast hash is right here: the keys are random and high-entropy, so there is
nothing for a slow KDF to protect, and hashing sits on every request.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import tempfile
from pathlib import Path

import yaml

__all__ = ["KEY_PREFIX", "add_key_hash", "hash_api_key", "new_api_key", "read_keys_file"]

KEY_PREFIX = "og-"
_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(key: str | bytes) -> str:
    raw = key.encode() if isinstance(key, str) else key
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def read_keys_file(path: Path) -> dict[str, list[str]]:
    """Read `{tenants: {TENANT: [sha256:...]}}`; a missing file holds no keys."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
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
    stored = read_keys_file(path)
    stored.setdefault(tenant, []).append(key_hash)
    body = "# Written by `owngate keys new`: SHA-256 digests of tenant API keys.\n"
    body += yaml.safe_dump({"tenants": stored}, sort_keys=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
